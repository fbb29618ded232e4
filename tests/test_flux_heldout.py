"""A FLUX checkpoint of dimensions no other test uses, served through models/flux.dsl, against
diffusers' FluxPipeline from the same checkpoint (issue 28's held-out check).

Checkpoint: 3 heads x 16, 3 double + 1 single blocks, T5 d_model 48, axes_dims_rope (4, 6, 6), a
3-block VAE (48x48 -> 6x6 packed tokens), 16 text tokens; random weights saved with each class's
save_pretrained (codegen/checkpoint.py materialize_checkpoint, as conftest's tiny checkpoints).
Oracle: FluxPipeline.from_pretrained(DIR), 12 steps, compared by tests/oracle_util.py's rule.
Measured (2026-12-02, 2-core CPU): 8 prompt/seed pairs, 7 pixel-identical and one with a single
value 1 off, before and after the host RoPE; per step, the served program is within 2e-6 of
diffusers' transformer, all of it the attention path (the program with diffusers' processors
is bit-identical, test below).
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import shared_store_dir
from oracle_util import assert_images_close

REPO = Path(__file__).resolve().parent.parent
# the checkpoint's configs, in the order of models/flux.dsl's `default { ... }` blocks
HELD_OUT = (
    """vocab_size: 1000, hidden_size: 32, intermediate_size: 37, num_hidden_layers: 1
    num_attention_heads: 2, max_position_embeddings: 77, projection_dim: 32
    bos_token_id: 1, eos_token_id: 2, pad_token_id: 0""",
    """vocab_size: 1000, d_model: 48, d_ff: 64, d_kv: 16, num_layers: 1, num_heads: 3
    relative_attention_num_buckets: 8, feed_forward_proj: "gated-gelu"
    pad_token_id: 0, eos_token_id: 2, decoder_start_token_id: 0""",
    """patch_size: 1, in_channels: 16, num_layers: 3, num_single_layers: 1, attention_head_dim: 16
    num_attention_heads: 3, joint_attention_dim: 48, pooled_projection_dim: 32
    guidance_embeds: true, axes_dims_rope: [4, 6, 6]""",
    """in_channels: 3, out_channels: 3, latent_channels: 4, layers_per_block: 1, norm_num_groups: 4
    down_block_types: ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"]
    up_block_types: ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"]
    block_out_channels: [8, 8, 16], sample_size: 48, scaling_factor: 0.3611, shift_factor: 0.1159
    use_quant_conv: false, use_post_quant_conv: false""",
)
SIZE = dict(height=48, width=48, max_sequence_length=16)
CALL = dict(prompt="a red fox in the snow", num_inference_steps=12, guidance_scale=3.5)


def _lowered():
    from difflet.frontend.lower import lower_text

    text = (REPO / "models" / "flux.dsl").read_text()
    blocks = iter(HELD_OUT)
    text = re.sub(r"default \{[^}]*\}", lambda _: "default {" + next(blocks) + "}", text)
    return lower_text(text, "held-out flux", {"height": "48", "width": "48", "max_text": "16", "dtype": "float32"})


@pytest.fixture(scope="module")
def held_out() -> Path:
    from difflet.codegen.checkpoint import resolve_weights

    return resolve_weights(_lowered(), "random:7", shared_store_dir())


def test_program_with_diffusers_attention_is_diffusers_forward_bit_for_bit(held_out):
    """The RoPE part of the program on the held-out shapes: host tables in, no RoPE in the graph."""
    from diffusers import FluxPipeline, FluxTransformer2DModel

    from difflet.codegen.build import example_inputs
    from difflet.codegen.program import program_inputs
    from difflet.families.flux.host import rope_tables
    from difflet.families.flux.programs import FluxProgram

    node = _lowered().component("transformer")
    ref = FluxTransformer2DModel.from_pretrained(str(held_out), subfolder="transformer").eval()
    names = [v.name for v in program_inputs(node)]
    values = dict(zip(names, example_inputs(node)))
    values["img_rope"], values["txt_rope"] = rope_tables((4, 6, 6), 6, 6, 16, torch.float32, torch.float32)
    kwargs = {k: v for k, v in values.items() if k not in ("img_rope", "txt_rope", "valid_text")}
    with torch.no_grad():
        want = ref(**kwargs, img_ids=FluxPipeline._prepare_latent_image_ids(1, 6, 6, "cpu", torch.float32),
                   txt_ids=torch.zeros(16, 3), return_dict=False)[0]
        got = FluxProgram(copy.deepcopy(ref), node)(*[values[n] for n in names])[0]
    assert torch.equal(got, want)


@pytest.mark.slow  # compiles four programs (about 90 s on 2 cores with an empty store)
def test_held_out_checkpoint_matches_fluxpipeline(held_out):
    from diffusers import FluxPipeline

    from difflet import DiffletPipeline

    with DiffletPipeline.from_pretrained(held_out, dtype=torch.float32,  # flux, found from model_index.json
                                         store=shared_store_dir(), **SIZE) as pipe:
        config = pipe.runner.module.component("transformer").attrs["config"]
        assert (config["num_attention_heads"], config["num_layers"], config["joint_attention_dim"]) == (3, 3, 48)
        ours = np.asarray(pipe(seed=3, **CALL).images[0])
    ref = FluxPipeline.from_pretrained(str(held_out))
    ref.set_progress_bar_config(disable=True)
    want = np.asarray(ref(generator=torch.Generator("cpu").manual_seed(3), output_type="pil", **SIZE,
                          **CALL).images[0])
    assert ours.shape == (48, 48, 3) and ours.std() > 0
    assert_images_close(ours, want, "held-out FLUX checkpoint: DiffletPipeline vs FluxPipeline")
