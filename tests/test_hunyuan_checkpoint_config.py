"""models/hunyuan-video.dsl takes every config from the checkpoint, against diffusers'
HunyuanVideoPipeline.

Oracle: `HunyuanVideoPipeline.from_pretrained(DIR)` on a HunyuanVideo checkpoint whose dimensions
no description in models/ states (3 heads of 12 with RoPE axes 4 + 4 + 4, 2 dual-stream + 1
single-stream blocks, a Llama of hidden_size 48 and a CLIP of 40, a VAE of block_out_channels
[8, 12, 16, 16] with 6 latent channels; diffusers' AutoencoderKLHunyuanVideo compresses time 4x only), built from the real
diffusers/transformers classes and saved sharded (index files), and
`DiffletPipeline.from_pretrained(DIR)` with no model named, which must find the family from
model_index.json and take every config from that checkpoint.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import shared_store_dir
from difflet.ir.nodes import Op
from oracle_util import assert_images_close, io_shape as _shape

pytestmark = pytest.mark.slow  # compiles and serves a model: full suite only

REPO = Path(__file__).resolve().parent.parent
HUNYUAN = REPO / "models" / "hunyuan-video.dsl"
# 3 layers so hidden_states[-3] (the pipeline's skip of 2) is a real layer output; positions for
# max_sequence_length + the template's 95 tokens
LLAMA = dict(vocab_size=1000, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, hidden_act="silu",
             bos_token_id=1, eos_token_id=2, pad_token_id=0)
CLIP = dict(vocab_size=1000, hidden_size=40, intermediate_size=50, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=77, projection_dim=40, bos_token_id=1, eos_token_id=2, pad_token_id=0)
TRANSFORMER = dict(in_channels=6, out_channels=6, num_attention_heads=3, attention_head_dim=12, num_layers=2,
                   num_single_layers=1, num_refiner_layers=1, mlp_ratio=2.0, patch_size=2, patch_size_t=1,
                   qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=48, pooled_projection_dim=40,
                   rope_theta=256.0, rope_axes_dim=(4, 4, 4))
VAE = dict(in_channels=3, out_channels=3, latent_channels=6, down_block_types=("HunyuanVideoDownBlock3D",) * 4,
           up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 12, 16, 16), layers_per_block=1,
           norm_num_groups=4, scaling_factor=0.5, spatial_compression_ratio=8, temporal_compression_ratio=4)
SIZE = dict(height=32, width=64, num_frames=5, max_sequence_length=16)
CALL = dict(prompt="a red fox running through the snow", num_inference_steps=3, guidance_scale=6.0, seed=5)
# hunyuanvideo-community/HunyuanVideo's transformer/config.json and vae/config.json (diffusers 0.32)
REAL_TRANSFORMER = dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128,
                        num_layers=20, num_single_layers=40, num_refiner_layers=2, mlp_ratio=4.0, patch_size=2,
                        patch_size_t=1, qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=4096,
                        pooled_projection_dim=768, rope_theta=256.0, rope_axes_dim=[16, 56, 56])
REAL_VAE = dict(act_fn="silu", block_out_channels=[128, 256, 512, 512], down_block_types=["HunyuanVideoDownBlock3D"] * 4,
                in_channels=3, latent_channels=16, layers_per_block=2, mid_block_add_attention=True,
                norm_num_groups=32, out_channels=3, scaling_factor=0.476986, spatial_compression_ratio=8,
                temporal_compression_ratio=4, up_block_types=["HunyuanVideoUpBlock3D"] * 4)


def _build(dest: Path) -> Path:
    """The checkpoint: HunyuanVideoPipeline of freshly initialized classes, save_pretrained with
    small shards; word-level tokenizers as the tiny checkpoints have (codegen/checkpoint.py)."""
    from diffusers import (AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline,
                           HunyuanVideoTransformer3DModel)
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel, PreTrainedTokenizerFast

    from difflet.codegen.tiny_tokenizers import special_ids, word_level_tokenizer

    word_level_tokenizer(LLAMA["vocab_size"], special_ids(LLAMA), clip_style=False,
                         max_length=SIZE["max_sequence_length"] + 95, dest=dest / "tokenizer_src")
    word_level_tokenizer(CLIP["vocab_size"], special_ids(CLIP), clip_style=True, max_length=77,
                         dest=dest / "tokenizer_2_src")
    torch.manual_seed(0)
    text_encoder = LlamaModel(LlamaConfig(**LLAMA)).eval()
    torch.manual_seed(1)
    text_encoder_2 = CLIPTextModel(CLIPTextConfig(**CLIP)).eval()
    torch.manual_seed(2)
    transformer = HunyuanVideoTransformer3DModel(**TRANSFORMER).eval()
    torch.manual_seed(3)
    vae = AutoencoderKLHunyuanVideo(**VAE).eval()
    pipe = HunyuanVideoPipeline(
        tokenizer=PreTrainedTokenizerFast.from_pretrained(str(dest / "tokenizer_src")), text_encoder=text_encoder,
        tokenizer_2=PreTrainedTokenizerFast.from_pretrained(str(dest / "tokenizer_2_src")),
        text_encoder_2=text_encoder_2, transformer=transformer, vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))  # the description's scheduler
    ckpt = dest / "ckpt"
    pipe.save_pretrained(str(ckpt), max_shard_size="40KB")
    return ckpt


@pytest.fixture(scope="module")
def fine_tune(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("hunyuan-fine-tune"))


@pytest.fixture(scope="module")
def pipe(fine_tune):
    from difflet import DiffletPipeline

    with DiffletPipeline.from_pretrained(fine_tune, dtype="float32", store=shared_store_dir(), **SIZE) as p:
        yield p


def _reference(ckpt: Path) -> np.ndarray:
    from diffusers import HunyuanVideoPipeline

    ref = HunyuanVideoPipeline.from_pretrained(str(ckpt))
    ref.set_progress_bar_config(disable=True)
    out = ref(CALL["prompt"], generator=torch.Generator("cpu").manual_seed(CALL["seed"]), height=SIZE["height"],
              width=SIZE["width"], num_frames=SIZE["num_frames"], max_sequence_length=SIZE["max_sequence_length"],
              num_inference_steps=CALL["num_inference_steps"], guidance_scale=CALL["guidance_scale"],
              output_type="np")
    return (out.frames[0] * 255).round().astype(np.uint8)


def _heads(transformer) -> list[tuple[int, int]]:
    return [(a.attrs["heads"], a.attrs["head_dim"]) for a in transformer.find(Op.ATTENTION)]


def test_checkpoint_is_sharded(fine_tune):
    for sub, name in (("transformer", "diffusion_pytorch_model"), ("text_encoder", "model")):
        assert (fine_tune / sub / f"{name}.safetensors.index.json").is_file()
        assert not (fine_tune / sub / f"{name}.safetensors").exists()


def test_hunyuan_description_serves_a_checkpoint_of_other_dimensions(pipe, fine_tune):
    module = pipe.runner.module
    assert module.attrs["source"].endswith("hunyuan-video.dsl")  # found from model_index.json
    transformer, vae = module.component("transformer"), module.component("vae")
    assert transformer.attrs["config"]["num_attention_heads"] == 3  # taken from the checkpoint
    assert _heads(transformer) == [(3, 12), (3, 12)]
    latents = [1, 6, (5 - 1) // 4 + 1, 32 // 8, 64 // 8]  # the pipeline's prepare_latents
    assert _shape(transformer, "hidden_states") == _shape(transformer, "sample") == latents
    assert _shape(transformer, "encoder_hidden_states") == [1, 16, 48]
    assert _shape(transformer, "pooled_projections") == [1, 40]
    assert _shape(module.component("text_encoder"), "prompt_embeds") == [1, 16 + 95, 48]
    assert _shape(module.component("text_encoder_2"), "pooled") == [1, 40]
    assert _shape(vae, "z") == latents and _shape(vae, "sample") == [1, 3, 5, 32, 64]
    out = pipe(output_type="np", **CALL)
    ours = (out.frames[0] * 255).round().astype(np.uint8)
    assert ours.shape == (5, 32, 64, 3) and ours.std() > 0
    ref = _reference(fine_tune)
    for i, (got, want) in enumerate(zip(ours, ref, strict=True)):
        assert_images_close(got, want, f"frame {i}: DiffletPipeline vs HunyuanVideoPipeline")


def _real_size_shapes(module) -> None:
    from difflet.passes.model_facts import tokens

    transformer, vae = module.component("transformer"), module.component("vae")
    assert tokens(transformer)["visual"] == 16 * 20 * 32 == 10240 and tokens(transformer)["text"] == 256
    assert _shape(module.component("text_encoder"), "input_ids") == [1, 351]
    assert _shape(module.component("text_encoder"), "prompt_embeds") == [1, 351, 4096]
    assert _shape(module.component("text_encoder_2"), "input_ids") == [1, 77]
    assert _shape(module.component("text_encoder_2"), "pooled") == [1, 768]
    assert _shape(transformer, "hidden_states") == _shape(transformer, "sample") == [1, 16, 16, 40, 64]
    assert _shape(transformer, "encoder_hidden_states") == [1, 256, 4096]
    assert _shape(transformer, "pooled_projections") == [1, 768]
    assert _shape(transformer, "timestep") == _shape(transformer, "guidance") == [1]
    assert _heads(transformer) == [(24, 128), (24, 128)]
    assert _shape(vae, "z") == [1, 16, 16, 40, 64] and _shape(vae, "sample") == [1, 3, 61, 320, 512]
    assert 1.2e10 < transformer.attrs["params"] < 1.35e10  # HunyuanVideo's 13B


def test_without_weights_the_real_size_shapes():
    from difflet.frontend.lower import lower_file

    _real_size_shapes(lower_file(str(HUNYUAN)))


def test_the_real_configs_lower_without_weights_files(tmp_path):
    """Only config.json files are read at lower time: HunyuanVideo's own configs, as transformers
    and diffusers write them, give the real-size shapes."""
    from transformers import CLIPTextConfig, LlamaConfig

    from difflet.frontend.lower import lower_file

    llama = LlamaConfig(vocab_size=128320, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                        rms_norm_eps=1e-5).to_dict()
    clip = CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                          num_attention_heads=12, max_position_embeddings=77, projection_dim=768,
                          bos_token_id=0, eos_token_id=2, pad_token_id=1).to_dict()
    for sub, config in (("text_encoder", llama), ("text_encoder_2", clip),
                        ("transformer", dict(REAL_TRANSFORMER, _class_name="HunyuanVideoTransformer3DModel")),
                        ("vae", dict(REAL_VAE, _class_name="AutoencoderKLHunyuanVideo"))):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "config.json").write_text(json.dumps(config))
    _real_size_shapes(lower_file(str(HUNYUAN), weights=str(tmp_path)))


def test_the_fine_tunes_configs_lower_at_another_size(fine_tune):
    """The fine-tune's configs at another profile size: latents follow the VAE's compression ratios."""
    from difflet.frontend.lower import lower_file

    module = lower_file(str(HUNYUAN), {"height": "48", "width": "64", "frames": "9", "max_text": "8"},
                        str(fine_tune))
    assert _shape(module.component("transformer"), "hidden_states") == [1, 6, 3, 6, 8]
    assert _shape(module.component("vae"), "sample") == [1, 3, 9, 48, 64]


def test_stated_config_contradicted_by_the_checkpoint_is_located(fine_tune, monkeypatch):
    """hunyuan-video-tiny.dsl states its configs inline; this checkpoint has other values."""
    monkeypatch.chdir(REPO)  # the location holds the path as given
    from click.testing import CliRunner

    from difflet.cli import main

    lines = (REPO / "models" / "hunyuan-video-tiny.dsl").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "hidden_size: 32" in text)
    col = lines[line - 1].index("hidden_size") + 1
    r = CliRunner().invoke(main, ["lower", "models/hunyuan-video-tiny.dsl", "--weights", str(fine_tune)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    head, snippet = r.stderr.strip().split("\n")
    assert re.fullmatch(rf"error: models/hunyuan-video-tiny\.dsl:{line}:{col}: component 'text_encoder': the "
                        r"description states hidden_size = 32, the checkpoint's text_encoder/config\.json has 48",
                        head), head
    assert snippet.strip().startswith("hidden_size: 32")
