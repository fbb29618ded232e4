"""HunyuanVideoAttnProcessor2_0's math around the attention call, shared by Difflet's world-1
(hunyuan_video/programs.py) and split (hunyuan_video/attention.py) processors.

Invariants:
- Projections, per-head q/k RMS norms, RoPE on the visual rows, the added (text) projections and
  the output projections are diffusers', in its order; a processor supplies only the attention.
- Heads come from the projection width (`-1` with the full head_dim), so a TP rank's contiguous
  shard of heads works too; `attn.heads` (the full count) is never used to split.
- Torch only (no torch.distributed): the world-1 program imports it.
"""
from __future__ import annotations

import torch


def _rope_visual(x: torch.Tensor, n_vis: int, rotary) -> torch.Tensor:
    """apply_rotary_emb on the first n_vis rows ([B, S, H, D]), text rows untouched (diffusers' order)."""
    from diffusers.models.embeddings import apply_rotary_emb

    if n_vis == x.shape[1]:
        return apply_rotary_emb(x, rotary, sequence_dim=1)
    return torch.cat([apply_rotary_emb(x[:, :n_vis], rotary, sequence_dim=1), x[:, n_vis:]], dim=1)


def joint_qkv(attn, hidden_states, encoder_hidden_states, image_rotary_emb, text_len: int):
    """HunyuanVideoAttnProcessor2_0's q, k, v [B, S, H, D] over the joint [visual, text] rows:
    projections, q/k norms, RoPE on the visual rows, the added (text) projections, in its order.
    H comes from the projection width, so a TP rank's shard of heads works too; text_len is the
    text rows' count in the joint sequence (a split rank's single-stream projections gather it)."""
    head_dim = attn.inner_dim // attn.heads
    single = attn.add_q_proj is None and encoder_hidden_states is not None
    if single:  # single-stream: one projection over the concatenated [visual, text]
        hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)
    query, key, value = (proj(hidden_states).unflatten(2, (-1, head_dim))
                         for proj in (attn.to_q, attn.to_k, attn.to_v))
    if attn.norm_q is not None:
        query = attn.norm_q(query)
    if attn.norm_k is not None:
        key = attn.norm_k(key)
    if image_rotary_emb is not None:
        n_vis = query.shape[1] - (text_len if single else 0)
        query, key = _rope_visual(query, n_vis, image_rotary_emb), _rope_visual(key, n_vis, image_rotary_emb)
    if attn.add_q_proj is not None and encoder_hidden_states is not None:
        enc = [proj(encoder_hidden_states).unflatten(2, (-1, head_dim))
               for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)]
        if attn.norm_added_q is not None:
            enc[0] = attn.norm_added_q(enc[0])
        if attn.norm_added_k is not None:
            enc[1] = attn.norm_added_k(enc[1])
        query, key, value = (torch.cat([x, e], dim=1) for x, e in zip((query, key, value), enc))
    return query, key, value


def mask_valid_text(attention_mask, text_len: int):
    """valid_text read back from the key mask the model built ([B, 1, 1, V + T] over the full
    streams, True on [0, V + valid_text)); rows share it (one runtime value per call), so the
    first row's is read. None without a mask."""
    if attention_mask is None:
        return None
    return attention_mask[0].reshape(-1).to(torch.int64).sum() - (attention_mask.shape[-1] - text_len)


def joint_out(attn, out: torch.Tensor, text_len: int, dtype):
    """The attention output [B, H, S, D] -> (visual, text) through to_out / to_add_out."""
    hidden_states = out.transpose(1, 2).flatten(2, 3).to(dtype)
    n_vis = hidden_states.shape[1] - text_len
    hidden_states, encoder_hidden_states = hidden_states[:, :n_vis], hidden_states[:, n_vis:]
    if getattr(attn, "to_out", None) is not None:
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
    if getattr(attn, "to_add_out", None) is not None:
        encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
    return hidden_states, encoder_hidden_states
