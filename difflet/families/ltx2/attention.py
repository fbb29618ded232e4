"""LTX-2 split attention (private to ltx2/programs.py): diffusers' LTX2AudioVideoAttnProcessor math
on one rank of a split layout.

Invariants:
- Projections, the q/k RMS norms (across heads: under TP split_layout has made them
  ParallelRMSNorm, their sum of squares all-reduced over tp), the split RoPE and the head split
  are LTX2AudioVideoAttnProcessor's (same calls, same order); only the attention call differs.
- Heads come from the projection width (`-1` with attn.head_dim): under TP a rank holds a
  contiguous shard of heads, and the RoPE tables arrive already cut to that shard
  (SplitDecl.head_tables on the model's four RoPE modules); `attn.heads` is never used to split.
- Why only video is CP-sharded (shared/models.md, LTX-2 at 512x768x121): 126 audio tokens of width
  2048 against 6,144 video tokens of 4096, so audio is ~0.5% of a block's linear FLOPs
  (126 * 2048^2 / (6144 * 4096^2)); replicating it over cp costs less than the exchange a sharded
  audio self-attention would need at every block, and 126 tokens do not divide by 4. Audio stays
  TP-split by heads like every block linear (and token-sharded over tp with SP).
- Streams: the video stream is CP-sharded (this rank's chunk of tokens and of its RoPE tables),
  audio and text are replicated over cp. So the site's planned mode decides: video self-attention
  (attn1) attends the whole video over the CP group in the planned mode; video->audio
  (video_to_audio_attn: audio queries over video keys) is `gather_kv`, every video key and value
  (at the audio width) gathered for the replicated audio queries; every other site has replicated keys (text, audio) and is
  `local`: this rank's queries against every key, the SDPA call diffusers' native backend makes.
- No mask: the connectors' registers replace the text padding (ltx2/programs.py), so LTX-2.0's
  attention has no mask and no gated heads; either is refused, as is interleaved RoPE (its
  tables are not cut per head here).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from difflet.errors import DiffletError
from difflet.parallel.joint_attention import self_attention


class LTX2SplitAttnProcessor:
    """Drop-in for LTX2AudioVideoAttnProcessor on a split rank. Signature: split_layout's
    processor factory (text_len, text_first, mode, group); text needs no bound (registers)."""

    def __init__(self, text_len: int, text_first: bool, mode: str, group) -> None:
        self.mode, self.group = mode, group

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, query_rotary_emb=None,
                 key_rotary_emb=None, perturbation_mask=None, all_perturbed=None) -> torch.Tensor:
        from diffusers.models.transformers.transformer_ltx2 import apply_split_rotary_emb

        # a perturbed_attn block passes its (unset) STG mask; STG itself is ltx2/guidance.py's hook
        if perturbation_mask is not None or all_perturbed:
            raise DiffletError("STG reaches split attention through the guidance_pass input only",
                               where="LTX2Attention")
        if attention_mask is not None or attn.to_gate_logits is not None or attn.rope_type != "split":
            raise DiffletError("Difflet's split LTX-2 attention serves LTX-2.0's blocks: no attention mask, "
                               "no gated attention, split RoPE", where="LTX2Attention")
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        query, key, value = attn.to_q(hidden_states), attn.to_k(context), attn.to_v(context)
        query, key = attn.norm_q(query), attn.norm_k(key)
        if query_rotary_emb is not None:
            query = apply_split_rotary_emb(query, query_rotary_emb)
            key = apply_split_rotary_emb(key, key_rotary_emb if key_rotary_emb is not None else query_rotary_emb)
        q, k, v = (t.unflatten(2, (-1, attn.head_dim)).transpose(1, 2) for t in (query, key, value))
        if self.mode == "local":  # keys replicated on every rank: diffusers' own SDPA call
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=False)
        else:  # keys are CP-sharded video: the planned exchange over the CP group
            out = self_attention(self.mode, q, k, v, self.group)
        hidden_states = out.transpose(1, 2).flatten(2, 3).to(query.dtype)
        return attn.to_out[1](attn.to_out[0](hidden_states))
