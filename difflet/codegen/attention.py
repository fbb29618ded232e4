"""Difflet's attention for denoisers: one joint bounded-attention op, plus per-family processors.

Invariants:
- The op (`joint_bounded_attention`) knows nothing about any model: it takes q/k/v over a joint
  sequence (text segment + visual segment in the model's order) and a runtime valid-text count,
  rearranges the keys as [visual, valid text, text padding] so the valid keys are one interval,
  and calls the kernel contract `bounded_attention` (fused SDPA, difflet/kernels) with bounds
  [0, V + valid_text). Queries keep the model's order, so outputs line up with the reference.
- Softmax is invariant to key order, so with valid_text == T the op equals dense attention.
- The Flux processor computes q/k/v exactly as diffusers' FluxAttnProcessor and differs only in
  the attention call.
"""
from __future__ import annotations

import fnmatch

import torch

from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op
from difflet.kernels.attention_fused import bounded_attention


def joint_bounded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, text_len: int,
                            valid_text: torch.Tensor | None, text_first: bool = True) -> torch.Tensor:
    """Attention over a joint [text, visual] (or [visual, text]) sequence, text keys >= valid_text excluded.

    q/k/v are [B, H, S, D] with S = text_len + V in the model's order; valid_text is a 0-d int64
    tensor in [1, text_len] (None = all text is valid). Returns [B, H, S, D] in query order.
    """
    seq = k.shape[-2]
    if text_first:
        k_text, k_vis = k[..., :text_len, :], k[..., text_len:, :]
        v_text, v_vis = v[..., :text_len, :], v[..., text_len:, :]
    else:
        k_vis, k_text = k[..., : seq - text_len, :], k[..., seq - text_len:, :]
        v_vis, v_text = v[..., : seq - text_len, :], v[..., seq - text_len:, :]
    # [visual, text]: text padding sits after the valid text, so valid keys are [0, V + valid).
    keys = torch.cat([k_vis, k_text], dim=-2)
    values = torch.cat([v_vis, v_text], dim=-2)
    n_vis = seq - text_len
    if valid_text is None:
        valid_text = torch.tensor(text_len, dtype=torch.int64, device=q.device)
    lo = torch.zeros((), dtype=torch.int64, device=q.device)
    hi = valid_text.to(device=q.device, dtype=torch.int64).reshape(()) + n_vis
    return bounded_attention(q, keys, values, lo, hi)


class FluxBoundedAttnProcessor:
    """Drop-in for diffusers' FluxAttnProcessor that routes attention through the joint bounded op.

    `text_len` is the static text length T (needed by single-stream blocks, whose input is the
    already-concatenated [text, visual] sequence). `valid_text` arrives via joint_attention_kwargs.
    """

    fixed_text_len = False  # split layouts: the text stream may be an SP token shard, T is static

    def __init__(self, text_len: int, text_first: bool = True) -> None:
        self.text_len = text_len
        self.text_first = text_first

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, text_len: int,
               valid_text: torch.Tensor | None) -> torch.Tensor:
        """[B, H, S, D] joint q/k/v in the model's order -> output in query order (the one call
        a split layout replaces)."""
        return joint_bounded_attention(q, k, v, text_len, valid_text, self.text_first)

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor = None,
                 attention_mask: torch.Tensor | None = None, image_rotary_emb=None,
                 valid_text: torch.Tensor | None = None) -> torch.Tensor:
        from diffusers.models.embeddings import apply_rotary_emb
        from diffusers.models.transformers.transformer_flux import _get_qkv_projections

        if attention_mask is not None:
            raise DiffletError("Difflet's Flux attention takes valid_text, not an attention_mask",
                               where="joint_attention_kwargs")
        query, key, value, enc_q, enc_k, enc_v = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        query = attn.norm_q(query.unflatten(-1, (-1, attn.head_dim)))
        key = attn.norm_k(key.unflatten(-1, (-1, attn.head_dim)))
        value = value.unflatten(-1, (-1, attn.head_dim))
        if attn.added_kv_proj_dim is not None:
            enc_q = attn.norm_added_q(enc_q.unflatten(-1, (-1, attn.head_dim)))
            enc_k = attn.norm_added_k(enc_k.unflatten(-1, (-1, attn.head_dim)))
            enc_v = enc_v.unflatten(-1, (-1, attn.head_dim))
            query = torch.cat([enc_q, query], dim=1)
            key = torch.cat([enc_k, key], dim=1)
            value = torch.cat([enc_v, value], dim=1)
        if image_rotary_emb is not None:
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
            key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)

        text_len = self.text_len if self.fixed_text_len or encoder_hidden_states is None \
            else encoder_hidden_states.shape[1]
        out = self.attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), text_len, valid_text)
        hidden_states = out.transpose(1, 2).flatten(2, 3).to(query.dtype)

        if encoder_hidden_states is not None:
            encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                [text_len, hidden_states.shape[1] - text_len], dim=1)
            hidden_states = attn.to_out[1](attn.to_out[0](hidden_states.contiguous()))
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states.contiguous())
            return hidden_states, encoder_hidden_states
        return hidden_states


# Which processor serves which denoiser class (the IR names the class; the site globs say where).
PROCESSORS = {"diffusers.FluxTransformer2DModel": FluxBoundedAttnProcessor}


def _text_len(node: Node) -> int:
    """The static text length: the text-stream input's sequence dimension."""
    for inp in node.find(Op.INPUT):
        if inp.name == "encoder_hidden_states":
            return inp.results[0].type.shape[1]
    raise DiffletError(f"denoiser {node.name!r} has joint attention but no encoder_hidden_states input",
                       where=node.loc)


def install_attention(model: torch.nn.Module, node: Node) -> int:
    """Replace the processors of every joint attention site the IR's `attention` nodes name;
    returns the count.

    Self/cross sites without a text mask describe the model to the planner (heads, order) and keep
    the class's own processor: with no padding to exclude, it computes the same attention.
    Raises DiffletError for an unsupported class, a masked non-joint site, an order, or a glob
    that matches nothing.
    """
    sites = node.find(Op.ATTENTION)
    for site in sites:
        if site.attrs.get("kind") != "joint" and site.attrs.get("text_mask"):
            raise DiffletError(f"attention kind {site.attrs.get('kind')!r} with a text mask is not "
                               f"supported for {node.attrs['class']} (only joint)", where=site.loc)
    sites = [s for s in sites if s.attrs.get("kind") == "joint"]
    if not sites:
        return 0
    from difflet.codegen.family import class_registry

    processors = {**PROCESSORS, **class_registry("PROCESSORS")}
    cls = processors.get(node.attrs["class"])
    if cls is None:
        raise DiffletError(f"no Difflet attention processor for {node.attrs['class']} "
                           f"(supported: {', '.join(processors)})", where=node.loc)
    modules = dict(model.named_modules())
    count = 0
    for site in sites:
        order = tuple(site.attrs.get("order", ("text", "visual")))
        if sorted(order) != ["text", "visual"]:
            raise DiffletError(f"joint attention order must be (text, visual) or (visual, text), got {order}",
                               where=site.loc)
        matched = [m for name, m in modules.items() if fnmatch.fnmatchcase(name, site.name)]
        if not matched:
            raise DiffletError(f"attention site {site.name!r} matches no module of {node.attrs['class']}",
                               where=site.loc)
        for mod in matched:
            if getattr(mod, "heads", site.attrs.get("heads")) != site.attrs.get("heads") or \
                    getattr(mod, "head_dim", site.attrs.get("head_dim")) != site.attrs.get("head_dim"):
                raise DiffletError(f"attention site {site.name!r}: the model has heads={mod.heads}, "
                                   f"head_dim={mod.head_dim}; the IR says {site.attrs.get('heads')}, "
                                   f"{site.attrs.get('head_dim')}", where=site.loc)
            mod.set_processor(cls(_text_len(node), text_first=order[0] == "text"))
            count += 1
    if hasattr(cls, "prepare_model"):  # a class whose forward needs adapting to the program convention
        cls.prepare_model(model, node)
    return count


# at the bottom: split_qwen imports this module's op lazily, so either may be imported first
from difflet.codegen.split_qwen import QwenBoundedAttnProcessor  # noqa: E402

PROCESSORS["diffusers.QwenImageTransformer2DModel"] = QwenBoundedAttnProcessor
