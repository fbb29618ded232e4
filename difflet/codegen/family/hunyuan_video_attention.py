"""HunyuanVideo split attention (private to family/hunyuan_video.py): diffusers'
HunyuanVideoAttnProcessor2_0 math on one rank of a split layout, at both joint sites.

Invariants:
- Projections, per-head q/k RMS norms, RoPE on the visual rows and the added (text) projections
  are HunyuanVideoAttnProcessor2_0's, in its order; only the attention call differs: the joint
  [visual, text] keys attended over the CP group in the planned mode
  (codegen.attention.split_joint_attention) with valid keys [0, V + valid_text).
- Heads come from the projection width (`-1` with the full head_dim): under TP a rank holds a
  contiguous shard of heads; `attn.heads` (the full count) is never used to split.
- The text length is the static T of the layout (under SP the text entering a block is a token
  shard; the q/k/v projections have gathered it back to T rows). The single-stream block's
  concatenation [visual shard, text shard] is the joint token segments its linears gather.
- valid_text is read from the key mask the model built before its blocks: [B, 1, 1, V + T] over
  the *full* visual and text streams (the visual stream is sharded at transformer_blocks.0 and
  the SP text there too, SplitDecl.stream_entries / sp_inputs), True on [0, V + valid_text).
- RoPE arrives already cut to this rank's CP chunk (SplitDecl.cp_tables on the model's `rope`).
"""
from __future__ import annotations

import torch

from difflet.codegen.attention import split_joint_attention
from difflet.errors import DiffletError


def _rope_visual(x: torch.Tensor, n_vis: int, rotary) -> torch.Tensor:
    """apply_rotary_emb on the first n_vis rows ([B, S, H, D]), text rows untouched (diffusers' order)."""
    from diffusers.models.embeddings import apply_rotary_emb

    if n_vis == x.shape[1]:
        return apply_rotary_emb(x, rotary, sequence_dim=1)
    return torch.cat([apply_rotary_emb(x[:, :n_vis], rotary, sequence_dim=1), x[:, n_vis:]], dim=1)


class HunyuanVideoSplitAttnProcessor:
    """Drop-in for HunyuanVideoAttnProcessor2_0 on a split rank (heads: this rank's TP shard;
    visual queries/keys: this rank's CP chunk). Signature: split_layout's processor factory."""

    def __init__(self, text_len: int, text_first: bool, mode: str, group) -> None:
        if text_first:
            raise DiffletError("HunyuanVideo's joint sequence is (visual, text)", where="order")
        self.text_len, self.mode, self.group = text_len, mode, group

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, image_rotary_emb=None):
        if encoder_hidden_states is None:
            raise DiffletError("Difflet's split HunyuanVideo attention serves the joint sites only",
                               where="HunyuanVideoAttention")
        t = self.text_len
        head_dim = attn.inner_dim // attn.heads
        single = attn.add_q_proj is None
        if single:  # one projection over [visual, text] (under SP: both shards, gathered by to_q)
            hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)
        query, key, value = (proj(hidden_states).unflatten(2, (-1, head_dim))
                             for proj in (attn.to_q, attn.to_k, attn.to_v))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if image_rotary_emb is not None:
            n_vis = query.shape[1] - (t if single else 0)
            query, key = _rope_visual(query, n_vis, image_rotary_emb), _rope_visual(key, n_vis, image_rotary_emb)
        if not single:
            enc = [proj(encoder_hidden_states).unflatten(2, (-1, head_dim))
                   for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)]
            if attn.norm_added_q is not None:
                enc[0] = attn.norm_added_q(enc[0])
            if attn.norm_added_k is not None:
                enc[1] = attn.norm_added_k(enc[1])
            query, key, value = (torch.cat([x, e], dim=1) for x, e in zip((query, key, value), enc))

        valid_text = None
        if attention_mask is not None:  # over the full [V, T] keys: V = its length - T
            valid_text = attention_mask[0].reshape(-1).to(torch.int64).sum() - (attention_mask.shape[-1] - t)
        out = split_joint_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), t,
                                    False, valid_text, self.mode, self.group)
        hidden_states = out.transpose(1, 2).flatten(2, 3).to(query.dtype)
        hidden_states, encoder_hidden_states = hidden_states[:, :-t], hidden_states[:, -t:]
        if getattr(attn, "to_out", None) is not None:
            hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if getattr(attn, "to_add_out", None) is not None:
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states
