"""Wan 2.1 split attention (private to wan/programs.py): diffusers' WanAttnProcessor math on one
rank of a split layout.

Invariants:
- Projections, the q/k RMS norms (across heads: under TP split_layout has made them
  ParallelRMSNorm, whose sum of squares is all-reduced over tp), head split and RoPE are exactly
  WanAttnProcessor's (same calls, same order); only the attention call differs.
- Heads come from the projection width (`-1` with the full head_dim): under TP a rank holds a
  contiguous shard of heads, and `attn.heads` (the full count) is never used to split.
- Self-attention (attn1: no encoder_hidden_states) attends the whole visual sequence over the CP
  group in the planned mode (parallel.joint_attention.self_attention). Cross-attention (attn2)
  has replicated text keys, so it is local: this rank's queries against every text token, no
  bound (Wan attends its zero-padded text unmasked, as diffusers does).
- RoPE arrives already cut to this rank's CP chunk (SplitDecl.cp_tables on the model's `rope`).
- Text-to-video only: the I2V image context (add_k_proj) and attention masks are refused.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from difflet.errors import DiffletError
from difflet.parallel.joint_attention import self_attention


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """WanAttnProcessor's apply_rotary_emb, verbatim (interleaved pairs, tables in float)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


class WanSplitAttnProcessor:
    """Drop-in for WanAttnProcessor on a split rank (heads: this rank's TP shard; queries and, for
    self-attention, keys: this rank's CP chunk). Signature: split_layout's processor factory."""

    def __init__(self, text_len: int, text_first: bool, mode: str, group) -> None:
        self.mode, self.group = mode, group

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, rotary_emb=None) -> torch.Tensor:
        from diffusers.models.transformers.transformer_wan import _get_qkv_projections

        if attn.add_k_proj is not None or attention_mask is not None:
            raise DiffletError("Difflet's split Wan attention is text-to-video only: no image context "
                               "(add_k_proj) and no attention_mask", where="WanAttention")
        query, key, value = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        query, key = attn.norm_q(query), attn.norm_k(key)
        head_dim = attn.inner_dim // attn.heads
        query, key, value = (t.unflatten(2, (-1, head_dim)) for t in (query, key, value))
        if rotary_emb is not None:
            query, key = _rope(query, *rotary_emb), _rope(key, *rotary_emb)
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, H_local, S, D]
        if encoder_hidden_states is None:
            out = self_attention(self.mode, q, k, v, self.group)
        else:  # keys are the replicated text: local, the same SDPA call diffusers' native backend makes
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=False)
        hidden_states = out.transpose(1, 2).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](hidden_states))
