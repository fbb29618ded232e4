"""Read the static facts passes need from a pipeline-level component (no torch, no weights).

Invariants: every number comes from the IR (input shapes, attention nodes, config attrs,
params); a fact the IR lacks is returned as 0/None, never guessed from a model name.
Streams: `visual` tokens come from input `hidden_states`, `text` from `encoder_hidden_states`,
`audio` from `audio_hidden_states`; 5-D video latents [B, C, F, H, W] are divided by the
config's patch sizes.
"""
from __future__ import annotations

import math

from difflet.ir.nodes import Attrs, Module, Node, Op, TensorType
from difflet.passes.layout_attrs import Site

STREAM_INPUTS = {"visual": "hidden_states", "text": "encoder_hidden_states",
                 "audio": "audio_hidden_states"}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "int64": 8, "int32": 4}


def compiled(m: Module) -> list[Node]:
    """Every node that becomes a program: `component` nodes and the `probe` node, in order."""
    return [n for n in m.body if n.op in (Op.COMPONENT, Op.PROBE)]


def config(comp: Node) -> Attrs:
    return comp.attrs.get("config") or Attrs()


def input_type(comp: Node, name: str) -> TensorType | None:
    for n in comp.find(Op.INPUT, name):
        t = n.results[0].type
        return t if isinstance(t, TensorType) else None
    return None


def _patch(cfg: Attrs) -> tuple[int, int, int]:
    p = cfg.get("patch_size", 1)
    if isinstance(p, tuple):
        return tuple(int(x) for x in p)  # type: ignore[return-value]
    return int(cfg.get("patch_size_t", 1) or 1), int(p), int(p)


def stream_tokens(comp: Node, stream: str) -> int:
    """Tokens of one stream as the transformer sees them (after patchifying)."""
    t = input_type(comp, STREAM_INPUTS[stream])
    if t is None:
        return 0
    if len(t.shape) == 5 and stream == "visual":
        pt, ph, pw = _patch(config(comp))
        _, _, f, h, w = t.shape
        return (f // pt) * (h // ph) * (w // pw)
    if len(t.shape) == 4 and stream == "visual":
        _, ph, pw = _patch(config(comp))
        return (t.shape[2] // ph) * (t.shape[3] // pw)
    return t.shape[1] if len(t.shape) >= 2 else 0


def tokens(comp: Node) -> dict[str, int]:
    return {s: stream_tokens(comp, s) for s in STREAM_INPUTS}


def attention_sites(comp: Node) -> list[Node]:
    return comp.find(Op.ATTENTION)


def hidden_size(comp: Node) -> int:
    """The widest attention's heads * head_dim (the residual stream width of the main stream)."""
    sizes = [v.heads * v.head_dim for v in map(Site.of, attention_sites(comp))]
    if sizes:
        return max(sizes)
    cfg = config(comp)
    heads_width = int(cfg.get("num_attention_heads") or 0) * int(cfg.get("attention_head_dim") or 0)
    return int(cfg.get("hidden_size") or cfg.get("d_model") or heads_width)


def mlp_hidden(comp: Node) -> int:
    cfg = config(comp)
    if cfg.get("ffn_dim"):
        return int(cfg["ffn_dim"])
    return int(float(cfg.get("mlp_ratio", 4.0)) * hidden_size(comp))


HEAD_KEYS = ("num_attention_heads", "num_heads", "num_key_value_heads")


def head_counts(comp: Node) -> list[tuple[str, int]]:
    """(config key, count) of every attention/KV head count a TP split must divide: the
    config's own keys and its `text_config`'s (multimodal encoders split only their language
    model, so a `vision_config` is not listed)."""
    cfg = config(comp)
    out = [(k, int(cfg[k])) for k in HEAD_KEYS if isinstance(cfg.get(k), int)]
    text = cfg.get("text_config")
    if isinstance(text, Attrs):
        out += [(f"text_config.{k}", int(text[k])) for k in HEAD_KEYS if isinstance(text.get(k), int)]
    return out


def dtype_bytes(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype, 4)


def guidance_branches(module: Module) -> int:
    """2 when the denoise step runs true classifier-free guidance (two passes), else 1 (the mode
    the description names, else its family's default)."""
    from difflet.families import uses_negative_prompt

    return 2 if uses_negative_prompt(module) else 1


def round_up(n: int, tile: int) -> int:
    return int(math.ceil(n / tile) * tile) if tile > 1 else n
