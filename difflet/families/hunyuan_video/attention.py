"""HunyuanVideo split attention (private to hunyuan_video/programs.py): diffusers'
HunyuanVideoAttnProcessor2_0 math on one rank of a split layout, at both joint sites.

Invariants:
- The math around the attention call is hunyuan_video_joint's (diffusers' order; a TP rank's
  shard of heads from the projection width); only the attention call differs: the joint
  [visual, text] keys attended over the CP group in the planned mode
  (codegen.attention.split_joint_attention) with valid keys [0, V + valid_text).
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

from difflet.codegen.joint_ops import split_joint_attention
from difflet.families.hunyuan_video.joint import joint_out, joint_qkv, mask_valid_text
from difflet.errors import DiffletError
from difflet.kernels.select import FUSED


class HunyuanVideoSplitAttnProcessor:
    """Drop-in for HunyuanVideoAttnProcessor2_0 on a split rank (heads: this rank's TP shard;
    visual queries/keys: this rank's CP chunk). Signature: split_layout's processor factory."""

    kernel = FUSED  # the program's bounded-attention kernel: install_attention sets it (kernels/select.py)

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
        query, key, value = joint_qkv(attn, hidden_states, encoder_hidden_states, image_rotary_emb, t)
        out = split_joint_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), t,
                                    False, mask_valid_text(attention_mask, t), self.mode, self.group, self.kernel)
        return joint_out(attn, out, t, query.dtype)
