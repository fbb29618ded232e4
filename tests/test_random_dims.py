"""Fidelity on arbitrary dimensions (issue 28 item 6): FLUX and Wan 2.1 configurations drawn from a
fixed seed (heads, head_dim and its RoPE split, layer counts, text widths and lengths, VAE depth),
each a random checkpoint served by the real-size description (models/flux.dsl, models/wan2.1.dsl)
and held to the family's diffusers pipeline on the same checkpoint under the closeness rule.

Oracle: FluxPipeline / WanPipeline `from_pretrained(DIR)`. Served by ModelRunner over the eager
program modules (the very modules codegen compiles: Difflet's attention, host RoPE tables, masks),
so drawing configurations costs no compiles; the compiled path at dimensions no description states
is held by tests/test_flux_heldout.py and tests/test_{wan,qwen,hunyuan}_checkpoint_config.py.
"""
from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import shared_store_dir
from oracle_util import assert_images_close

pytestmark = pytest.mark.slow  # five checkpoints, each served and run through its pipeline
REPO = Path(__file__).resolve().parent.parent
DRAW_SEED = 20261203
PROMPT = "a red fox running through the snow"


def _even_split(rng: random.Random) -> list[int]:
    return [2 * rng.randint(1, 4) for _ in range(3)]


def flux_configs(n: int) -> list[dict]:
    """`n` FLUX configurations: RoPE axes (each even) sum to head_dim, as FluxPosEmbed requires."""
    rng, out = random.Random(DRAW_SEED), []
    for _ in range(n):
        axes = _even_split(rng)
        t5_heads, d_kv, clip = rng.randint(1, 4), rng.choice([8, 12, 16]), rng.choice([16, 24, 32])
        blocks = rng.randint(2, 3)  # VAE blocks: 2 ** (blocks - 1) x spatial, then 2x2 packing
        px = 2 ** blocks * rng.randint(2, 4)
        out.append(dict(
            clip=f"""vocab_size: 1000, hidden_size: {clip}, intermediate_size: {clip + 5}, num_hidden_layers: 1
            num_attention_heads: {clip // 8}, max_position_embeddings: 77, projection_dim: {clip}
            bos_token_id: 1, eos_token_id: 2, pad_token_id: 0""",
            t5=f"""vocab_size: 1000, d_model: {t5_heads * d_kv}, d_ff: {t5_heads * d_kv + 8}, d_kv: {d_kv}
            num_layers: 1, num_heads: {t5_heads}, relative_attention_num_buckets: 8
            feed_forward_proj: "gated-gelu", pad_token_id: 0, eos_token_id: 2, decoder_start_token_id: 0""",
            transformer=f"""patch_size: 1, in_channels: 16, num_layers: {rng.randint(1, 3)}
            num_single_layers: {rng.randint(1, 2)}, attention_head_dim: {sum(axes)}
            num_attention_heads: {rng.randint(1, 4)}, joint_attention_dim: {t5_heads * d_kv}
            pooled_projection_dim: {clip}, guidance_embeds: true, axes_dims_rope: {axes}""",
            vae=f"""in_channels: 3, out_channels: 3, latent_channels: 4, layers_per_block: 1, norm_num_groups: 4
            down_block_types: {["DownEncoderBlock2D"] * blocks}, up_block_types: {["UpDecoderBlock2D"] * blocks}
            block_out_channels: {[8] * (blocks - 1) + [16]}, sample_size: {px}, scaling_factor: 0.3611
            shift_factor: 0.1159, use_quant_conv: false, use_post_quant_conv: false""".replace("'", '"'),
            profile={"height": str(px), "width": str(px), "max_text": str(rng.choice([8, 16, 24])),
                     "steps": "4", "dtype": "float32"}))
    return out


def wan_configs(n: int) -> list[dict]:
    """`n` Wan 2.1 configurations: head_dim even (WanRotaryPosEmbed splits it t/h/w)."""
    rng, out = random.Random(DRAW_SEED + 1), []
    for _ in range(n):
        heads, d_kv = rng.randint(1, 3), rng.choice([8, 12])
        mult = [1] + [rng.choice([1, 2]) for _ in range(3)]
        out.append(dict(
            umt5=f"""vocab_size: 1000, d_model: {heads * d_kv}, d_ff: {heads * d_kv + 6}, d_kv: {d_kv}
            num_layers: 1, num_heads: {heads}, relative_attention_num_buckets: 8
            feed_forward_proj: "gated-gelu", pad_token_id: 0, eos_token_id: 1, decoder_start_token_id: 0""",
            transformer=f"""patch_size: [1, 2, 2], num_attention_heads: {rng.randint(1, 3)}
            attention_head_dim: {rng.choice([8, 12, 16])}, in_channels: 4, out_channels: 4
            text_dim: {heads * d_kv}, freq_dim: 16, ffn_dim: {rng.choice([24, 40])}, num_layers: {rng.randint(1, 2)}
            cross_attn_norm: true, qk_norm: "rms_norm_across_heads", eps: 0.000001, rope_max_seq_len: 64""",
            vae=f"""base_dim: 8, z_dim: 4, dim_mult: {mult}, num_res_blocks: 1, attn_scales: []
            temperal_downsample: [false, true, true], dropout: 0.0
            latents_mean: [0.1, -0.2, 0.0, 0.3], latents_std: [1.2, 0.8, 1.0, 1.5]""",
            profile={"height": "32", "width": "32", "frames": str(rng.choice([5, 9])),
                     "max_text": str(rng.choice([8, 16])), "steps": "3", "dtype": "float32"}))
    return out


def _lower(dsl: str, blocks: list[str], profile: dict):
    from difflet.frontend.lower import lower_text
    from difflet.passes.pipeline import optimize

    text = (REPO / "models" / dsl).read_text()
    it = iter(blocks)
    text = re.sub(r"default \{[^}]*\}", lambda _: "default {" + next(it) + "}", text)
    return optimize(lower_text(text, f"drawn {dsl}", profile))


def _served(module, ckpt: Path, **request) -> np.ndarray:
    from difflet.codegen.artifacts import eager_programs
    from difflet.runtime.runner import ModelRunner

    runner = ModelRunner(module, eager_programs(module, ckpt), ckpt)
    result = runner.generate(runner.resolve(prompt=PROMPT, **request))
    return result.image if result.video is None else result.video


@pytest.mark.parametrize("case", range(3))
def test_a_drawn_flux_configuration_serves_fluxpipelines_image(case):
    from diffusers import FluxPipeline

    from difflet.codegen.checkpoint import resolve_weights

    config = flux_configs(3)[case]
    module = _lower("flux.dsl", [config["clip"], config["t5"], config["transformer"], config["vae"]],
                    config["profile"])
    ckpt = resolve_weights(module, f"random:{100 + case}", shared_store_dir())
    ours = _served(module, ckpt, seed=case)
    px, text = int(config["profile"]["height"]), int(config["profile"]["max_text"])
    ref = FluxPipeline.from_pretrained(str(ckpt))
    ref.set_progress_bar_config(disable=True)
    want = ref(PROMPT, generator=torch.Generator("cpu").manual_seed(case), num_inference_steps=4,
               guidance_scale=3.5, height=px, width=px, max_sequence_length=text, output_type="np").images[0]
    assert ours.shape == (px, px, 3) and ours.std() > 0
    assert_images_close(ours, (want * 255).round().astype(np.uint8), f"drawn FLUX {case}: {config['transformer']}")


@pytest.mark.parametrize("case", range(2))
def test_a_drawn_wan_configuration_serves_wanpipelines_video(case):
    from diffusers import WanPipeline

    from difflet.codegen.checkpoint import resolve_weights

    config = wan_configs(2)[case]
    module = _lower("wan2.1.dsl", [config["umt5"], config["transformer"], config["vae"]], config["profile"])
    ckpt = resolve_weights(module, f"random:{200 + case}", shared_store_dir())
    ours = _served(module, ckpt, seed=case, guidance=4.0)
    frames, text = int(config["profile"]["frames"]), int(config["profile"]["max_text"])
    ref = WanPipeline.from_pretrained(str(ckpt))
    ref.set_progress_bar_config(disable=True)
    want = ref(PROMPT, generator=torch.Generator("cpu").manual_seed(case), num_inference_steps=3,
               guidance_scale=4.0, height=32, width=32, num_frames=frames, max_sequence_length=text,
               output_type="np").frames[0]
    assert ours.shape == (frames, 32, 32, 3) and ours.std() > 0
    for i, (got, exp) in enumerate(zip(ours, (want * 255).round().astype(np.uint8), strict=True)):
        assert_images_close(got, exp, f"drawn Wan {case}, frame {i}: {config['transformer']}")
