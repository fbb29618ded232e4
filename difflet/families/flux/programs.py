"""FLUX codegen declarations: FluxPipeline checkpoints and FluxTransformer2DModel's processors,
split facts, step-caching probe and the program wrapper that takes RoPE tables as inputs.

Invariants:
- The attention processors compute q/k/v exactly as diffusers' FluxAttnProcessor and differ
  only in the attention call: Difflet's joint bounded op (world 1) or the planned CP mode over
  this rank's head and visual shard (split). FLUX attends its text padding, so its valid-text
  count defaults to the padded length.
- The probe runs the denoiser's input projection, timestep/guidance/pooled embedding and the
  first block's norm1 (AdaLayerNormZero), stopping before attention (difflet/codegen/probe.py).
- No RoPE is computed in any FLUX graph (Neuron cores have no FP64; diffusers' FluxPosEmbed
  runs in float64 on CPU): the host computes the tables with diffusers' own FluxPosEmbed
  (difflet/families/flux/host.py) and the program takes them as inputs img_rope / txt_rope
  [tokens, 2 * head_dim] (cos | sin, float32), fed where diffusers' forward takes img_ids /
  txt_ids; the model's pos_embed only splits the concatenated table (`FluxRopeTable`), so
  `pos_embed(cat(txt, img))` is diffusers' own table bit for bit. NxD Inference does the same:
  its host wrapper computes `pos_embed(ids)` and passes image_rotary_emb into the compiled model.
"""
from __future__ import annotations

import torch

from difflet.codegen.joint_ops import joint_bounded_attention, split_joint_attention
from difflet.codegen.decl import BlockDecl, ClassDecl, ProbeDecl, SplitDecl
from difflet.codegen.probe_feature import FeatureProbe
from difflet.codegen.program_module import ProgramModule
from difflet.errors import DiffletError
from difflet.kernels.select import FUSED

# FluxPipeline's optional IP-Adapter components, absent
INDEX_EXTRAS = {"image_encoder": [None, None], "feature_extractor": [None, None]}

DENOISER = "diffusers.FluxTransformer2DModel"


class FluxBoundedAttnProcessor:
    """Drop-in for diffusers' FluxAttnProcessor that routes attention through the joint bounded op.

    `text_len` is the static text length T (needed by single-stream blocks, whose input is the
    already-concatenated [text, visual] sequence). `valid_text` arrives via joint_attention_kwargs.
    """

    fixed_text_len = False  # split layouts: the text stream may be an SP token shard, T is static
    kernel = FUSED  # the program's bounded-attention kernel: install_attention sets it (kernels/select.py)

    def __init__(self, text_len: int, text_first: bool = True) -> None:
        self.text_len = text_len
        self.text_first = text_first

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, text_len: int,
               valid_text: torch.Tensor | None) -> torch.Tensor:
        """[B, H, S, D] joint q/k/v in the model's order -> output in query order (the one call
        a split layout replaces)."""
        return joint_bounded_attention(q, k, v, text_len, valid_text, self.text_first, self.kernel)

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


class FluxSplitAttnProcessor(FluxBoundedAttnProcessor):
    """Flux attention whose joint attention runs over the CP group in `mode` (heads = this rank's
    TP shard). The text length is the static T: under SP the stream inputs are token shards."""

    fixed_text_len = True

    def __init__(self, text_len: int, text_first: bool, mode: str, group) -> None:
        super().__init__(text_len, text_first)
        self.mode, self.group = mode, group

    def attend(self, q, k, v, text_len, valid_text):
        return split_joint_attention(q, k, v, self.text_len, self.text_first, valid_text, self.mode, self.group,
                                     self.kernel)


class FluxProbe(FeatureProbe):
    """FluxTransformer2DModel up to the first block's norm1 output (its modulated visual input)."""

    def __init__(self, model: torch.nn.Module, feature_shape: tuple[int, ...], inputs: list[str]) -> None:
        super().__init__(feature_shape, inputs, model.x_embedder.weight.dtype)
        self.x_embedder = model.x_embedder
        self.time_text_embed = model.time_text_embed
        self.norm1 = model.transformer_blocks[0].norm1

    def feature(self, named: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = self.x_embedder(named["hidden_states"])
        # the same scaling as FluxTransformer2DModel.forward
        timestep = named["timestep"].to(hidden.dtype) * 1000
        if "guidance" in named:
            temb = self.time_text_embed(timestep, named["guidance"].to(hidden.dtype) * 1000,
                                        named["pooled_projections"])
        else:
            temb = self.time_text_embed(timestep, named["pooled_projections"])
        return self.norm1(hidden, emb=temb)[0]


class FluxRopeTable(torch.nn.Module):
    """Stands in for FluxPosEmbed: takes the host's [S, 2 * D] table (cos | sin), returns the
    (cos, sin) pair FluxPosEmbed would; a split, no arithmetic, no tensors of its own."""

    def forward(self, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        half = table.shape[-1] // 2
        return table[:, :half], table[:, half:]


# IR input -> the FluxTransformer2DModel.forward argument it is fed as (forward concatenates
# (txt_ids, img_ids) along tokens and hands the result to pos_embed, now FluxRopeTable)
ROPE_INPUTS = {"img_rope": "img_ids", "txt_rope": "txt_ids"}


class FluxProgram(ProgramModule):
    """The FLUX denoiser program: IR inputs as ProgramModule, with the host's RoPE tables fed in
    place of the position ids and the model's pos_embed replaced by FluxRopeTable."""

    def __init__(self, model: torch.nn.Module, node) -> None:
        super().__init__(model, node)
        missing = [n for n in ROPE_INPUTS if n not in self.input_names]
        stale = [n for n in ROPE_INPUTS.values() if n in self.input_names]
        if missing or stale:
            raise DiffletError(f"component {node.name!r}: a FLUX denoiser takes its RoPE tables as inputs "
                               f"img_rope and txt_rope (float32[tokens, 2 * head_dim]), not position ids; "
                               f"missing {missing}" + (f", has {stale}" if stale else ""), where=node.loc)
        self.input_names = [ROPE_INPUTS.get(n, n) for n in self.input_names]
        if not isinstance(model.pos_embed, FluxRopeTable):
            model.pos_embed = FluxRopeTable()  # FluxPosEmbed holds no tensors: the state dict is unchanged

CLASSES = {
    DENOISER: ClassDecl(
        processor=FluxBoundedAttnProcessor, wrapper=FluxProgram,
        split=SplitDecl(visual_inputs={"hidden_states": 1, "img_rope": 0}, visual_outputs={"sample": 1},
                        sp_entries=("context_embedder", "x_embedder"),
                        joint_prefixes=("single_transformer_blocks.",), processor=FluxSplitAttnProcessor),
        probe=ProbeDecl(inputs=("hidden_states", "timestep", "pooled_projections", "guidance"),
                        build=FluxProbe),
        blocks=BlockDecl(stacks=("transformer_blocks", "single_transformer_blocks"),
                         outputs=("encoder_hidden_states", "hidden_states"), tail=("hidden_states",)),
    ),
}
