"""Qwen-Image attention (private to qwen_image/programs.py): diffusers'
QwenDoubleStreamAttnProcessor2_0 math, Difflet's attention op.

Invariants:
- q/k/v projections, q/k RMS norms and RoPE are computed exactly as diffusers'
  QwenDoubleStreamAttnProcessor2_0 (same calls, same order); only the attention call differs.
- The joint order is [text, visual] (text first), as in diffusers.
- Text padding is MASKED: `valid_text` (0-d int64, None = all T valid) is the count of valid
  text keys; keys >= valid_text get weight exactly 0, so padding contents never reach the output.
  diffusers' `encoder_hidden_states_mask` is ignored here: the runtime value is the truth (the
  oracle passes the equivalent mask [1]*valid + [0]*pad).
- World 1 (`QwenBoundedAttnProcessor`) calls joint_bounded_attention(text_first=True); a split
  layout (`QwenSplitAttnProcessor`) calls split_joint_attention in the planned CP mode with this
  rank's head shard (TP) and visual shard (CP). Text is the full static T on every rank
  (under SP the column linears have already gathered the tokens).
- Qwen's model computes RoPE for the FULL visual grid; under CP the processor takes the rows of
  its own visual shard (contiguous, in CP rank order, as RankProgramModule shards the input).
"""
from __future__ import annotations

import functools
import math

import torch

from difflet.codegen.joint_ops import joint_bounded_attention, split_joint_attention
from difflet.errors import DiffletError
from difflet.kernels.select import FUSED
from difflet.ir.nodes import Node, Op
from difflet.parallel import comm


def _visual_tokens(node: Node) -> int:
    for inp in node.find(Op.INPUT):
        if inp.name == "hidden_states":
            return int(inp.results[0].type.shape[1])
    raise DiffletError(f"denoiser {node.name!r} has no hidden_states input", where=node.loc)


def _text_len(node: Node) -> int:
    for inp in node.find(Op.INPUT):
        if inp.name == "encoder_hidden_states":
            return int(inp.results[0].type.shape[1])
    raise DiffletError(f"denoiser {node.name!r} has no encoder_hidden_states input", where=node.loc)


def prepare_qwen_model(model: torch.nn.Module, node: Node) -> None:
    """Adapt the model instance to the program calling convention (idempotent).

    ProgramModule calls `model.forward(**inputs, joint_attention_kwargs=runtime)` directly, but
    Qwen's forward takes `attention_kwargs` and needs `img_shapes` for RoPE, and text RoPE must cover
    the static T even when the text stream is an SP shard (`install_static_rope`, for world 1
    and split programs alike). The IR carries only the
    visual token count, so the grid is taken square (the profiles have height == width); a
    non-square count raises instead of silently using wrong positions.
    """
    if getattr(model, "_difflet_prepared", False):
        return
    tokens = _visual_tokens(node)
    side = math.isqrt(tokens)
    if side * side != tokens:
        raise DiffletError(f"{node.attrs['class']}: {tokens} visual tokens is not a square grid; "
                           "Difflet's Qwen RoPE grid needs height == width", where=node.loc)
    forward = model.forward
    text_len = _text_len(node)

    @functools.wraps(forward)
    def program_forward(*args, joint_attention_kwargs=None, img_shapes=None,
                        encoder_hidden_states_mask=None, **kwargs):
        # the mask is dropped: valid_text is the truth, and under SP the text stream is a token
        # shard, which diffusers' mask shape check would reject
        return forward(*args, attention_kwargs=joint_attention_kwargs,
                       img_shapes=img_shapes or [(1, side, side)], **kwargs)

    model.forward = program_forward  # instance attribute: getattr(model, "forward") finds it
    install_static_rope(model.pos_embed, side, text_len)
    model._difflet_prepared = True


def install_static_rope(rope: torch.nn.Module, side: int, text_len: int) -> None:
    """RoPE tables of the static grid and all T text tokens (also under SP, where the text
    stream is a token shard), computed once by diffusers' own QwenEmbedRope and kept as real
    buffers (exact: view_as_real/view_as_complex round-trip): AOTInductor would otherwise fold
    the complex constant slicing into constants the program cannot name."""
    with torch.no_grad():
        vid, txt = rope([(1, side, side)], device=torch.device("cpu"), max_txt_seq_len=text_len)
    rope.register_buffer("difflet_vid_freqs", torch.view_as_real(vid).clone(), persistent=False)
    rope.register_buffer("difflet_txt_freqs", torch.view_as_real(txt).clone(), persistent=False)

    def static_rope(*_args, **_kwargs):  # the grid and T are static: the tables never change
        return torch.view_as_complex(rope.difflet_vid_freqs), torch.view_as_complex(rope.difflet_txt_freqs)

    rope.forward = static_rope


class QwenBoundedAttnProcessor:
    """Drop-in for QwenDoubleStreamAttnProcessor2_0 routing attention through the joint bounded op."""

    prepare_model = staticmethod(prepare_qwen_model)
    kernel = FUSED  # the program's bounded-attention kernel: install_attention sets it (kernels/select.py)

    def __init__(self, text_len: int, text_first: bool = True) -> None:
        if not text_first:
            raise DiffletError("Qwen-Image joint attention is text first: order (text, visual)")
        self.text_len = text_len

    def attend(self, q, k, v, valid_text):
        """[B, H, T + V, D] joint q/k/v, text first -> output in query order."""
        return joint_bounded_attention(q, k, v, self.text_len, valid_text, text_first=True, kernel=self.kernel)

    def img_freqs(self, freqs: torch.Tensor, local_visual: int) -> torch.Tensor:
        """RoPE rows of this rank's visual tokens (world 1: all of them)."""
        return freqs

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor = None,
                 encoder_hidden_states_mask: torch.Tensor = None, attention_mask: torch.Tensor | None = None,
                 image_rotary_emb=None, valid_text: torch.Tensor | None = None):
        from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

        if encoder_hidden_states is None or attention_mask is not None:
            raise DiffletError("Difflet's Qwen attention takes a text stream and valid_text, "
                               "not an attention_mask", where="attention_kwargs")
        head_dim = attn.inner_dim // attn.heads  # -1 absorbs the head count: TP shards columns
        img_q = attn.to_q(hidden_states).unflatten(-1, (-1, head_dim))
        img_k = attn.to_k(hidden_states).unflatten(-1, (-1, head_dim))
        img_v = attn.to_v(hidden_states).unflatten(-1, (-1, head_dim))
        txt_q = attn.add_q_proj(encoder_hidden_states).unflatten(-1, (-1, head_dim))
        txt_k = attn.add_k_proj(encoder_hidden_states).unflatten(-1, (-1, head_dim))
        txt_v = attn.add_v_proj(encoder_hidden_states).unflatten(-1, (-1, head_dim))
        if attn.norm_q is not None:
            img_q = attn.norm_q(img_q)
        if attn.norm_k is not None:
            img_k = attn.norm_k(img_k)
        if attn.norm_added_q is not None:
            txt_q = attn.norm_added_q(txt_q)
        if attn.norm_added_k is not None:
            txt_k = attn.norm_added_k(txt_k)
        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb
            img_freqs = self.img_freqs(img_freqs, img_q.shape[1])
            img_q = apply_rotary_emb_qwen(img_q, img_freqs, use_real=False)
            img_k = apply_rotary_emb_qwen(img_k, img_freqs, use_real=False)
            txt_q = apply_rotary_emb_qwen(txt_q, txt_freqs, use_real=False)
            txt_k = apply_rotary_emb_qwen(txt_k, txt_freqs, use_real=False)
        # the text length comes from the projections: under SP the stream *inputs* are token shards
        seq_txt = txt_q.shape[1]
        q = torch.cat([txt_q, img_q], dim=1).transpose(1, 2)
        k = torch.cat([txt_k, img_k], dim=1).transpose(1, 2)
        v = torch.cat([txt_v, img_v], dim=1).transpose(1, 2)
        out = self.attend(q, k, v, valid_text).transpose(1, 2).flatten(2, 3).to(q.dtype)
        txt_out, img_out = out[:, :seq_txt], out[:, seq_txt:]
        img_out = attn.to_out[0](img_out.contiguous())
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)  # dropout
        return img_out, attn.to_add_out(txt_out.contiguous())


class QwenSplitAttnProcessor(QwenBoundedAttnProcessor):
    """Qwen attention whose joint attention runs over the CP group in `mode` (heads: this rank's TP shard)."""

    def __init__(self, text_len: int, text_first: bool, mode: str, group) -> None:
        super().__init__(text_len, text_first)
        self.mode, self.group = mode, group

    def img_freqs(self, freqs: torch.Tensor, local_visual: int) -> torch.Tensor:
        if freqs.shape[0] == local_visual:
            return freqs
        r = comm.rank(self.group)  # contiguous shards in CP rank order (RankProgramModule's slicing)
        return freqs[r * local_visual:(r + 1) * local_visual]

    def attend(self, q, k, v, valid_text):
        return split_joint_attention(q, k, v, self.text_len, True, valid_text, self.mode, self.group, self.kernel)
