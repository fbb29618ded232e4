"""Hand-built IR Modules for the text, binary and verifier tests.

`flux_like_module()` follows docs/ir.md's FLUX pipeline-level example (tiny profile);
the others are edge cases that a printer/parser or encoder could get wrong.
"""
from __future__ import annotations

from difflet.ir.nodes import Attrs, Loc, Module, Node, Op, RuntimeType, TensorType, Value

SRC = "models/flux-tiny.dsl"


def at(line: int, col: int = 1) -> Loc:
    return Loc(SRC, line, col)


def _runtime(name: str, lo: int, hi: int, default: int, line: int) -> Node:
    return Node(Op.RUNTIME, name, Attrs(default=default, doc=f"the {name} runtime value"),
                results=(Value(name, RuntimeType("int64", lo, hi)),), loc=at(line, 3))


def _tensor_input(name: str, shape: tuple, line: int, dtype: str = "float32") -> Node:
    return Node(Op.INPUT, name, results=(Value(name, TensorType(dtype, shape)),), loc=at(line, 5))


def _transformer() -> Node:
    config = Attrs(patch_size=1, in_channels=64, out_channels=None, num_layers=1,
                   num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
                   joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=True,
                   axes_dims_rope=(2, 2, 4))
    body = (
        _tensor_input("hidden_states", (1, 64, 64), 20),
        _tensor_input("encoder_hidden_states", (1, 32, 32), 21),
        _tensor_input("pooled_projections", (1, 16), 22),
        _tensor_input("timestep", (1,), 23),
        _tensor_input("img_rope", (64, 16), 24),  # [tokens, 2 * head_dim]: cos | sin
        _tensor_input("txt_rope", (32, 16), 25),
        _tensor_input("guidance", (1,), 26),
        Node(Op.INPUT, "valid_text", args=("valid_text",),
             results=(Value("valid_text", RuntimeType("int64", 1, 32)),), loc=at(27, 5)),
        Node(Op.OUTPUT, "sample", Attrs(select=0),
             results=(Value("sample", TensorType("float32", (1, 64, 64))),), loc=at(28, 5)),
        Node(Op.ATTENTION, "transformer_blocks.*.attn",
             Attrs(kind="joint", heads=2, head_dim=8, order=("text", "visual"),
                   text_mask=False, valid="valid_text"), loc=at(29, 5)),
        Node(Op.ATTENTION, "single_transformer_blocks.*.attn",
             Attrs(kind="joint", heads=2, head_dim=8, order=("text", "visual"),
                   text_mask=False, valid="valid_text"), loc=at(30, 5)),
    )
    attrs = Attrs({"role": "denoiser", "class": "diffusers.FluxTransformer2DModel",
                   "subfolder": "transformer", "config": config, "entry": "forward",
                   "dtype": "float32", "params": 123456})
    return Node(Op.COMPONENT, "transformer", attrs, body=body, loc=at(18, 3))


def _encoder(name: str, cls: str, tok_len: int, hidden: int, line: int) -> Node:
    attrs = Attrs({"role": "encoder", "class": cls, "subfolder": name, "entry": "forward",
                   "dtype": "float32",
                   "tokenizer": Attrs({"class": "transformers.CLIPTokenizer",
                                       "subfolder": "tokenizer", "max_length": tok_len}),
                   "params": 4242})
    body = (
        _tensor_input("input_ids", (1, tok_len), line + 1, dtype="int64"),
        Node(Op.OUTPUT, "last_hidden_state", Attrs(select="last_hidden_state"),
             results=(Value("last_hidden_state", TensorType("float32", (1, tok_len, hidden))),),
             loc=at(line + 2, 5)),
    )
    return Node(Op.COMPONENT, name, attrs, body=body, loc=at(line, 3))


def _vae() -> Node:
    attrs = Attrs({"role": "decoder", "class": "diffusers.AutoencoderKL", "subfolder": "vae",
                   "entry": "decode", "dtype": "float32", "params": 999})
    body = (
        _tensor_input("z", (1, 16, 8, 8), 41),
        Node(Op.OUTPUT, "sample", Attrs(select="sample"),
             results=(Value("sample", TensorType("float32", (1, 3, 32, 32))),), loc=at(42, 5)),
    )
    return Node(Op.COMPONENT, "vae", attrs, body=body, loc=at(40, 3))


def _schedule() -> Node:
    scheduler = Attrs({"class": "diffusers.FlowMatchEulerDiscreteScheduler",
                       "config": Attrs(shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                                       max_shift=1.15, base_image_seq_len=256)})
    steps = (
        Node(Op.STEP, "flux.encode_prompt", args=("text_encoder", "text_encoder_2"),
             loc=at(50, 5)),
        Node(Op.STEP, "flux.prepare_latents", loc=at(51, 5)),
        Node(Op.STEP, "flux.denoise", Attrs(scheduler=scheduler,
                                            guidance=Attrs(mode="embedded", scale=3.5)),
             args=("transformer",), loc=at(52, 5)),
        Node(Op.STEP, "flux.decode", args=("vae",), loc=at(53, 5)),
    )
    return Node(Op.SCHEDULE, "main", body=steps, loc=at(49, 3))


def flux_like_module() -> Module:
    """A pipeline-level module shaped like docs/ir.md's FLUX example (tiny sizes)."""
    profile = Attrs(height=32, width=32, steps=4, guidance=3.5, max_text=32, clip_len=8,
                    dtype="float32")
    body = (
        _runtime("valid_text", 1, 32, 32, 3),
        _runtime("seed", 0, 2**63 - 1, 0, 4),
        _runtime("step", 0, 3, 0, 5),
        _encoder("text_encoder", "transformers.CLIPTextModel", 8, 16, 8),
        _encoder("text_encoder_2", "transformers.T5EncoderModel", 32, 32, 12),
        _transformer(),
        _vae(),
        _schedule(),
    )
    return Module("flux_tiny", "pipeline", Attrs(family="flux", profile=profile, source=SRC),
                  body, loc=at(1, 1))


def edge_attrs() -> Attrs:
    """Every attribute value type, incl. awkward strings, nested and empty containers."""
    return Attrs({
        "none": None, "t": True, "f": False, "zero": 0, "neg": -7, "big": 2**63 - 1,
        "float": 1.5, "tiny": 1e-05, "huge": 3.5e+20, "negzero": -0.0, "inf": float("inf"),
        "ninf": float("-inf"), "whole": 2.0,
        "quotes": 'say "hi"', "backslash": "a\\b\\\\c", "newline": "line1\nline2\ttab",
        "unicode": "ünïcødé ☃ 𝔘 日本", "ctrl": "\x00\x1f\x7f",
        "empty_str": "", "empty_tuple": (), "empty_attrs": Attrs(),
        "nested": (1, (2.0, ("x", None)), Attrs(a=(True, False), b=Attrs(c=Attrs()))),
        "weird key with spaces": 1, "true": "keyword key", "in": 2, "a.b": 3, "": "empty key",
    })


def edge_module() -> Module:
    """Quoted names, several results, keyword names, unknown and odd locs, deep bodies."""
    odd_loc = Loc('dir with "quotes"/ü.dsl', 7, 9)
    deep = Node(Op.SPLIT, "leaf", Attrs(), loc=Loc.unknown())
    for depth in range(4):
        deep = Node(Op.LAYOUT, f"level{depth}", Attrs(depth=depth), body=(deep,), loc=at(depth, 2))
    multi = Node(Op.COLLECTIVE, "all gather", edge_attrs(), args=("x", "y z"),
                 results=(Value("a", TensorType("bfloat16", ())),
                          Value("b.c", TensorType("int32", (0, -1, 5))),
                          Value("r", RuntimeType("int32", -3, 3)),
                          Value("true", TensorType("odd dtype", (2,)))),
                 loc=odd_loc)
    body = (
        Node(Op.RUNTIME, "in", results=(Value("in", RuntimeType("weird-dtype", 5, 1)),)),
        Node(Op.COMPONENT, "", Attrs(role="encoder"), body=(multi, deep), loc=at(99, 1)),
        Node(Op.PROBE, "p", body=(), loc=at(100, 100)),
        Node(Op.SCHEDULE, "main"),
    )
    return Module("edge module", "planned", edge_attrs(), body)


def empty_module() -> Module:
    return Module("m", "pipeline", Attrs(), ())


def all_samples() -> dict[str, Module]:
    return {"flux_like": flux_like_module(), "edge": edge_module(), "empty": empty_module()}
