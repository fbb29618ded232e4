"""Session fixtures shared by every test: the flux-tiny module, its random:0 checkpoint, its artifacts.

Compiled programs go to a store at $DIFFLET_TEST_STORE or <repo>/.pytest_cache/difflet-store, so
they are reused across tests and runs (a cache hit never compiles).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FLUX_TINY_DSL = REPO / "models" / "flux-tiny.dsl"


def test_store_dir() -> Path:
    return Path(os.environ.get("DIFFLET_TEST_STORE") or REPO / ".pytest_cache" / "difflet-store")


test_store_dir.__test__ = False  # a helper, not a test


def _flux_tiny_module():
    try:
        from difflet.frontend.lower import lower_file
        from difflet.passes.pipeline import optimize
    except ImportError:  # TEMPORARY until lower/optimize land: the same IR, built by hand
        return _hand_built_flux_tiny()
    return optimize(lower_file(str(FLUX_TINY_DSL)), parallel="tp1", target="cpu", backend="inductor")


def _hand_built_flux_tiny():
    """flux-tiny at planned level per docs/ir.md (stand-in until the real lower/optimize exist)."""
    import hashlib

    from difflet.ir.nodes import Attrs, Module, Node, Op, RuntimeType, TensorType, Value

    f32 = lambda *s: TensorType("float32", tuple(s))  # noqa: E731
    i64 = lambda *s: TensorType("int64", tuple(s))  # noqa: E731

    def io(op, name, ty, args=(), **attrs):
        return Node(op, name, Attrs(attrs), args=args, results=(Value(name, ty),))

    def comp(name, role, cls, config, body, entry="forward", tokenizer=None):
        attrs = dict(role=role, **{"class": cls}, subfolder=name, config=config, entry=entry,
                     dtype="float32")
        if tokenizer:
            attrs["tokenizer"] = tokenizer
        key = hashlib.sha256(repr((name, cls, config, body)).encode()).hexdigest()
        attrs["cache_key"] = key
        return Node(Op.COMPONENT, name, Attrs(attrs), body=tuple(body))

    valid = RuntimeType("int64", 1, 32)
    att = lambda glob: Node(Op.ATTENTION, glob, Attrs(kind="joint", heads=2, head_dim=16,  # noqa: E731
                                                      order=("text", "visual"), text_mask=False,
                                                      valid="valid_text"))
    tok = lambda sub, n: Attrs({"class": "transformers.PreTrainedTokenizerFast", "subfolder": sub,  # noqa: E731
                                "max_length": n})
    body = (
        io(Op.RUNTIME, "valid_text", valid, default=32, doc="valid T5 text keys"),
        io(Op.RUNTIME, "seed", RuntimeType("int64", 0, 2**63 - 1), default=0, doc="seed"),
        io(Op.RUNTIME, "step", RuntimeType("int64", 0, 3), default=0, doc="step"),
        comp("text_encoder", "encoder", "transformers.CLIPTextModel",
             Attrs(vocab_size=1000, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                   num_attention_heads=4, max_position_embeddings=16, projection_dim=32,
                   bos_token_id=1, eos_token_id=2, pad_token_id=0),
             [io(Op.INPUT, "input_ids", i64(1, 16)), io(Op.OUTPUT, "pooled", f32(1, 32), select="pooler_output")],
             tokenizer=tok("tokenizer", 16)),
        comp("text_encoder_2", "encoder", "transformers.T5EncoderModel",
             Attrs(vocab_size=1000, d_model=32, d_ff=37, d_kv=8, num_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, feed_forward_proj="gated-gelu",
                   pad_token_id=0, eos_token_id=2, decoder_start_token_id=0),
             [io(Op.INPUT, "input_ids", i64(1, 32)),
              io(Op.OUTPUT, "prompt_embeds", f32(1, 32, 32), select="last_hidden_state")],
             tokenizer=tok("tokenizer_2", 32)),
        comp("transformer", "denoiser", "diffusers.FluxTransformer2DModel",
             Attrs(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2,
                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                   pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=(4, 6, 6)),
             [io(Op.INPUT, "hidden_states", f32(1, 64, 16)),
              io(Op.INPUT, "encoder_hidden_states", f32(1, 32, 32)),
              io(Op.INPUT, "pooled_projections", f32(1, 32)), io(Op.INPUT, "timestep", f32(1)),
              io(Op.INPUT, "img_ids", f32(64, 3)), io(Op.INPUT, "txt_ids", f32(32, 3)),
              io(Op.INPUT, "guidance", f32(1)), io(Op.INPUT, "valid_text", valid, args=("valid_text",)),
              io(Op.OUTPUT, "sample", f32(1, 64, 16), select=0),
              att("transformer_blocks.*.attn"), att("single_transformer_blocks.*.attn")]),
        comp("vae", "decoder", "diffusers.AutoencoderKL",
             Attrs(in_channels=3, out_channels=3,
                   down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
                   up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
                   block_out_channels=(8, 16), layers_per_block=1, latent_channels=4,
                   norm_num_groups=4, sample_size=32, scaling_factor=0.3611, shift_factor=0.1159,
                   use_quant_conv=False, use_post_quant_conv=False),
             [io(Op.INPUT, "z", f32(1, 4, 16, 16)), io(Op.OUTPUT, "sample", f32(1, 3, 32, 32), select="sample")],
             entry="decode"),
        Node(Op.SCHEDULE, "main", body=(
            Node(Op.STEP, "flux.encode_prompt", args=("text_encoder", "text_encoder_2")),
            Node(Op.STEP, "flux.prepare_latents"),
            Node(Op.STEP, "flux.denoise", Attrs(
                scheduler=Attrs({"class": "diffusers.FlowMatchEulerDiscreteScheduler",
                                 "config": Attrs(shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                                                 max_shift=1.15, base_image_seq_len=256,
                                                 max_image_seq_len=4096)}),
                guidance=Attrs(mode="embedded", scale=3.5)), args=("transformer",)),
            Node(Op.STEP, "flux.decode", args=("vae",)),
        )),
    )
    profile = Attrs(height=32, width=32, steps=4, guidance=3.5, max_text=32, clip_len=16, dtype="float32")
    return Module("flux_tiny", "planned", Attrs(family="flux", profile=profile, source=str(FLUX_TINY_DSL),
                                                 parallel=Attrs(tp=1), target="cpu"), body)


@pytest.fixture(scope="session")
def flux_tiny_module():
    """flux-tiny lowered and optimized for tp1/cpu/inductor (planned level)."""
    return _flux_tiny_module()


@pytest.fixture(scope="session")
def flux_tiny_ckpt(flux_tiny_module):
    """The random:0 checkpoint of flux-tiny, materialized (once) under the test store."""
    from difflet.codegen.checkpoint import resolve_weights

    return resolve_weights(flux_tiny_module, "random:0", test_store_dir())


@pytest.fixture(scope="session")
def flux_tiny_art(flux_tiny_module, flux_tiny_ckpt, tmp_path_factory):
    """flux-tiny codegen'd with the inductor backend into a fresh ART dir (programs from the test store)."""
    from difflet.codegen.driver import codegen

    out = tmp_path_factory.mktemp("flux-tiny-art")
    codegen(flux_tiny_module, str(flux_tiny_ckpt), out, store=test_store_dir(), log=lambda *_: None)
    return out
