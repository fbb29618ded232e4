"""flux-shapes: a small FLUX-architecture text-to-image model trained on procedural shapes.

This module is the single source of the component configs (the classes are the real FLUX ones:
FluxTransformer2DModel, AutoencoderKL, CLIPTextModel, T5EncoderModel, word-level
PreTrainedTokenizerFast, FlowMatchEulerDiscreteScheduler) and of the training hyper-parameters.

Invariants the shipped pipeline relies on:
- image size is `IMAGE_SIZE` (32); the VAE downsamples 2x, FluxPipeline packs 2x2, so the
  transformer sees (32/4)^2 = 64 image tokens of 4*4 = 16 channels;
- CLIP text is padded to `CLIP_LEN` (the tokenizer's model_max_length, which FluxPipeline uses),
  T5 text to `MAX_TEXT`, which callers must pass as FluxPipeline's `max_sequence_length`
  (FLUX attends text padding, so a different padded length changes the conditioning);
- guidance is not embedded (guidance_embeds False); true CFG (true_cfg_scale with
  negative_prompt="") is available because training drops captions to "".
"""
from __future__ import annotations

from pathlib import Path

IMAGE_SIZE = 32
CLIP_LEN = 16
MAX_TEXT = 16
DEFAULT_STEPS = 28  # FluxPipeline's default num_inference_steps
VOCAB = 128  # the shared word-level vocabulary (difflet.codegen.checkpoint.CAPTION_WORDS) fits

CLIP_CONFIG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, max_position_embeddings=CLIP_LEN, projection_dim=32,
                   bos_token_id=1, eos_token_id=2, pad_token_id=0)
T5_CONFIG = dict(vocab_size=VOCAB, d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4,
                 relative_attention_num_buckets=8, feed_forward_proj="gated-gelu",
                 pad_token_id=0, eos_token_id=2, decoder_start_token_id=0)
TRANSFORMER_CONFIG = dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=4,
                          attention_head_dim=32, num_attention_heads=2, joint_attention_dim=32,
                          pooled_projection_dim=32, guidance_embeds=False, axes_dims_rope=[4, 14, 14])
VAE_CONFIG = dict(in_channels=3, out_channels=3,
                  down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
                  up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
                  block_out_channels=[16, 32], layers_per_block=1, latent_channels=4,
                  norm_num_groups=8, sample_size=IMAGE_SIZE, use_quant_conv=False,
                  use_post_quant_conv=False)
SCHEDULER_CONFIG = dict(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                        base_image_seq_len=256, max_image_seq_len=4096)

TRAIN = {
    "vae": dict(batch=32, steps=800, lr=2e-3, warmup=50, kl=1e-6),
    "dit": dict(dataset=20000, batch=32, steps=8000, lr=1.5e-3, warmup=300, cond_drop=0.1,
                ema=0.999, sigma_mean=0.0, sigma_std=1.0, sigma_uniform=0.25),
}


def build_models() -> dict:
    """Freshly initialised components (weights depend on torch's global seed)."""
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    return {"vae": AutoencoderKL(**VAE_CONFIG),
            "text_encoder": CLIPTextModel(CLIPTextConfig(**CLIP_CONFIG)),
            "text_encoder_2": T5EncoderModel(T5Config(**T5_CONFIG)),
            "transformer": FluxTransformer2DModel(**TRANSFORMER_CONFIG)}


def build_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG)


def write_tokenizers(dest: Path) -> None:
    """Word-level tokenizers in Difflet's shared vocabulary layout (CLIP adds bos, T5 does not)."""
    from difflet.codegen.checkpoint import _special_ids, _word_level_tokenizer

    _word_level_tokenizer(VOCAB, _special_ids(CLIP_CONFIG), True, CLIP_LEN, Path(dest) / "tokenizer")
    _word_level_tokenizer(VOCAB, _special_ids(T5_CONFIG), False, MAX_TEXT, Path(dest) / "tokenizer_2")


def load_tokenizers(src: Path):
    from transformers import PreTrainedTokenizerFast

    return (PreTrainedTokenizerFast.from_pretrained(str(Path(src) / "tokenizer")),
            PreTrainedTokenizerFast.from_pretrained(str(Path(src) / "tokenizer_2")))


ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "flux-shapes"


def load_pipeline(path: str | Path = ASSET_DIR):
    """The stock diffusers FluxPipeline from a saved directory, fp32 on CPU, progress bars off."""
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(str(path))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def generate(pipe, prompts: list[str], seeds: list[int], steps: int | None = None,
             true_cfg: float = 1.0, batch: int = 64):
    """uint8 [n, 32, 32, 3] images, image i from prompts[i] with its own seeded noise.

    Each image gets its own torch.Generator, so an image does not depend on how the list is
    batched. height/width and max_sequence_length are always passed: FluxPipeline's defaults
    (256 px, 512 text tokens) are not what the model was trained on.
    """
    import numpy as np
    import torch

    kw = {} if steps is None else {"num_inference_steps": steps}
    if true_cfg != 1.0:
        kw.update(true_cfg_scale=true_cfg)
    out = []
    for lo in range(0, len(prompts), batch):
        ps, ss = prompts[lo:lo + batch], seeds[lo:lo + batch]
        if true_cfg != 1.0:
            kw["negative_prompt"] = [""] * len(ps)
        with torch.no_grad():
            img = pipe(prompt=ps, height=IMAGE_SIZE, width=IMAGE_SIZE, max_sequence_length=MAX_TEXT,
                       generator=[torch.Generator().manual_seed(s) for s in ss], output_type="np",
                       **kw).images
        out.append(np.clip(np.rint(img * 255), 0, 255).astype(np.uint8))
    return np.concatenate(out)
