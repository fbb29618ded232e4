"""models/flux2-klein-4b.dsl (and -base-4b) take every config from the checkpoint, against
diffusers' Flux2KleinPipeline.

Oracle: `Flux2KleinPipeline.from_pretrained(DIR)` on a step-distilled klein checkpoint whose
dimensions no description in models/ states (3 heads of 8 with RoPE axes 2 x 4, 2 dual-stream + 1
single-stream blocks, a Qwen3 text model of hidden size 24, so 72-wide stacked features, a VAE of 3
latent channels: 12 patchified), built from the real classes and saved sharded, and
`DiffletPipeline.from_pretrained(DIR)` with no model named (model_index.json's
Flux2KleinPipeline with is_distilled picks flux2-klein-4b.dsl), which must take every config from
that checkpoint: shapes, heads and head_dim are expressions over them. This is how a klein 9B
checkpoint (Qwen3-8B, 32 heads, 8 + 24 blocks) is served: the same classes at other dimensions.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import shared_store_dir
from difflet.ir.nodes import Op
from oracle_util import assert_images_close, io_shape as _shape

REPO = Path(__file__).resolve().parent.parent
TEXT = dict(vocab_size=1000, hidden_size=24, intermediate_size=30, num_hidden_layers=28, num_attention_heads=3,
            num_key_value_heads=1, head_dim=8, max_position_embeddings=64, tie_word_embeddings=False,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)
TRANSFORMER = dict(patch_size=1, in_channels=12, num_layers=2, num_single_layers=1, attention_head_dim=8,
                   num_attention_heads=3, joint_attention_dim=72, timestep_guidance_channels=16, mlp_ratio=2.0,
                   axes_dims_rope=(2, 2, 2, 2), rope_theta=2000, guidance_embeds=False)
VAE = dict(down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
           block_out_channels=[8, 16], layers_per_block=1, latent_channels=3, norm_num_groups=4, sample_size=32)
# the description's scheduler (Difflet builds it from the schedule block, diffusers from the checkpoint)
SCHEDULER = dict(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                 max_image_seq_len=4096)
SIZE = dict(height=32, width=32, max_sequence_length=32)
CALL = dict(prompt="a red fox running through the snow", num_inference_steps=3, seed=5)


@pytest.fixture(scope="module")
def klein(tmp_path_factory) -> Path:
    """The checkpoint: Flux2KleinPipeline (is_distilled) of freshly initialized classes, saved with
    small shards; its tokenizer is the tiny Qwen3-shaped one random checkpoints get."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Transformer2DModel
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    from difflet.families.flux2.programs import random_vae, write_tokenizer

    dest = tmp_path_factory.mktemp("flux2-klein")
    write_tokenizer(None, TEXT, {"max_length": SIZE["max_sequence_length"]}, dest / "tokenizer_src")
    torch.manual_seed(0)
    text_encoder = Qwen3ForCausalLM(Qwen3Config(**TEXT)).eval()
    torch.manual_seed(1)
    transformer = Flux2Transformer2DModel(**TRANSFORMER).eval()
    torch.manual_seed(2)
    vae = random_vae(None, VAE).eval()
    pipe = Flux2KleinPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER), vae=vae,
                              text_encoder=text_encoder, transformer=transformer, is_distilled=True,
                              tokenizer=PreTrainedTokenizerFast.from_pretrained(str(dest / "tokenizer_src")))
    ckpt = dest / "ckpt"
    pipe.save_pretrained(str(ckpt), max_shard_size="40KB")
    return ckpt


@pytest.mark.slow  # compiles and serves a model: full suite only
def test_klein_description_serves_a_checkpoint_of_other_dimensions(klein):
    from diffusers import Flux2KleinPipeline

    from difflet import DiffletPipeline

    assert (klein / "transformer" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    assert json.loads((klein / "model_index.json").read_text())["is_distilled"] is True
    with DiffletPipeline.from_pretrained(klein, dtype="float32", store=shared_store_dir(), **SIZE) as pipe:
        module = pipe.runner.module
        assert module.attrs["source"].endswith("flux2-klein-4b.dsl")  # found from model_index.json
        transformer = module.component("transformer")
        assert [(a.attrs["heads"], a.attrs["head_dim"]) for a in transformer.find(Op.ATTENTION)] == [(3, 8)] * 2
        # 32 / 2 ** len(block_out_channels) = 8 per side: 64 tokens of 12 channels (3 latent x 2 x 2)
        assert _shape(transformer, "hidden_states") == _shape(transformer, "sample") == [1, 64, 12]
        assert _shape(transformer, "encoder_hidden_states") == [1, 32, 72]
        assert _shape(module.component("vae"), "z") == [1, 12, 8, 8]
        # guidance 4.0 is ignored, as the distilled pipeline ignores it: one pass a step
        out = pipe(CALL["prompt"], output_type="np", num_inference_steps=CALL["num_inference_steps"],
                   guidance_scale=4.0, seed=CALL["seed"])
    ours = (np.asarray(out.images[0]) * 255).round().astype(np.uint8)
    ref = Flux2KleinPipeline.from_pretrained(str(klein))
    ref.set_progress_bar_config(disable=True)
    want = ref(prompt=CALL["prompt"], guidance_scale=4.0, generator=torch.Generator("cpu").manual_seed(CALL["seed"]),
               num_inference_steps=CALL["num_inference_steps"], output_type="np", **SIZE).images[0]
    want = (np.asarray(want) * 255).round().astype(np.uint8)
    assert ours.shape == (32, 32, 3) and ours.std() > 0
    assert_images_close(ours, want, "DiffletPipeline vs Flux2KleinPipeline (other dimensions)")


def test_without_weights_the_real_shapes():
    from difflet.frontend.lower import lower_file
    from difflet.passes.model_facts import tokens

    for name in ("flux2-klein-4b", "flux2-klein-base-4b"):
        module = lower_file(str(REPO / "models" / f"{name}.dsl"))
        transformer = module.component("transformer")
        assert tokens(transformer)["visual"] == 64 * 64 == 4096 and tokens(transformer)["text"] == 512
        assert _shape(transformer, "hidden_states") == _shape(transformer, "sample") == [1, 4096, 128]
        assert _shape(transformer, "encoder_hidden_states") == [1, 512, 7680]  # 3 x Qwen3-4B's 2560
        assert [(a.attrs["heads"], a.attrs["head_dim"]) for a in transformer.find(Op.ATTENTION)] == [(24, 128)] * 2
        assert _shape(module.component("vae"), "z") == [1, 128, 64, 64]
        assert _shape(module.component("vae"), "sample") == [1, 3, 1024, 1024]
        # FLUX.2 [klein] 4B: ~3.9B transformer parameters, Qwen3-4B ~4.0B (tied embeddings)
        assert 3.7e9 < transformer.attrs["params"] < 4.1e9
        assert 3.9e9 < module.component("text_encoder").attrs["params"] < 4.1e9
