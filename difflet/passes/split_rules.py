"""Per-class Megatron split rules (data only): which linears split by column, which by row.

Invariants:
- Globs are module paths inside the component (`*` = one block index), matching diffusers /
  transformers attribute names of the installed versions.
- column: weight [out, in] split on dim 0 (q/k/v/gate/up), bias split; row: split on dim 1
  (out/down), bias added once after the reduction. `segments` says the row input is a
  concatenation (FLUX/Hunyuan single blocks: [attention, mlp]) each part split on its own.
- column_gather: the per-block modulation (AdaLN) linears: column split, then an all-gather of
  their small [B, k*dim] output over tp, so every block linear is split (memory.py divides
  `params_blocks_linear` by tp).
- `heads_norm_across`: q/k norms over all heads (Wan, LTX-2): under TP their sum of squares
  needs an all-reduce over the tp group.
- `probe`: the modules extract-probe keeps: input projections and first-block norm/modulation.
- `cfg_branch`: the inputs whose value differs between the conditional and unconditional pass
  of the family's CFG (passes/cfg_branch.py twins them under cfg2); the host step feeds them
  (difflet/runtime/host/<family>.py). A class without it is not built under cfg.
- Every linear not listed stays replicated (embedders, modulation, refiner, final projection).
"""
from __future__ import annotations

_ATTN_COL = ("to_q", "to_k", "to_v")
_JOINT_COL = _ATTN_COL + ("add_q_proj", "add_k_proj", "add_v_proj")


def _paths(prefix: str, names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"{prefix}.{n}" for n in names)


_MMDIT = (
    ("column", _paths("transformer_blocks.*.attn", _JOINT_COL)),
    ("row", ("transformer_blocks.*.attn.to_out.0", "transformer_blocks.*.attn.to_add_out")),
)

RULES: dict[str, dict] = {
    "diffusers.FluxTransformer2DModel": {
        "column": _MMDIT[0][1] + ("transformer_blocks.*.ff.net.0.proj",
                                  "transformer_blocks.*.ff_context.net.0.proj")
        + _paths("single_transformer_blocks.*.attn", _ATTN_COL) + ("single_transformer_blocks.*.proj_mlp",),
        "row": _MMDIT[1][1] + ("transformer_blocks.*.ff.net.2", "transformer_blocks.*.ff_context.net.2"),
        "row_segments": {"single_transformer_blocks.*.proj_out": ("attn", "mlp")},
        "column_gather": ("transformer_blocks.*.norm1.linear", "transformer_blocks.*.norm1_context.linear",
                          "single_transformer_blocks.*.norm.linear"),
        "heads_norm_across": False,
        "probe": ("x_embedder", "time_text_embed", "transformer_blocks.0.norm1"),
    },
    "diffusers.QwenImageTransformer2DModel": {
        "column": _MMDIT[0][1] + ("transformer_blocks.*.img_mlp.net.0.proj",
                                  "transformer_blocks.*.txt_mlp.net.0.proj"),
        "row": _MMDIT[1][1] + ("transformer_blocks.*.img_mlp.net.2", "transformer_blocks.*.txt_mlp.net.2"),
        "row_segments": {},
        "column_gather": ("transformer_blocks.*.img_mod.1", "transformer_blocks.*.txt_mod.1"),
        "heads_norm_across": False,
        "probe": ("img_in", "time_text_embed", "transformer_blocks.0.img_mod", "transformer_blocks.0.img_norm1"),
        "cfg_branch": ("encoder_hidden_states", "valid_text"),
    },
    "diffusers.WanTransformer3DModel": {
        "column": _paths("blocks.*.attn1", _ATTN_COL) + _paths("blocks.*.attn2", _ATTN_COL)
        + ("blocks.*.ffn.net.0.proj",),
        "row": ("blocks.*.attn1.to_out.0", "blocks.*.attn2.to_out.0", "blocks.*.ffn.net.2"),
        "row_segments": {},
        "heads_norm_across": True,
        "probe": ("patch_embedding", "condition_embedder", "blocks.0.scale_shift_table", "blocks.0.norm1"),
        "cfg_branch": ("encoder_hidden_states",),
    },
    "diffusers.HunyuanVideoTransformer3DModel": {
        "column": _MMDIT[0][1] + ("transformer_blocks.*.ff.net.0.proj",
                                  "transformer_blocks.*.ff_context.net.0.proj")
        + _paths("single_transformer_blocks.*.attn", _ATTN_COL) + ("single_transformer_blocks.*.proj_mlp",),
        "row": _MMDIT[1][1] + ("transformer_blocks.*.ff.net.2", "transformer_blocks.*.ff_context.net.2"),
        "row_segments": {"single_transformer_blocks.*.proj_out": ("attn", "mlp")},
        "column_gather": ("transformer_blocks.*.norm1.linear", "transformer_blocks.*.norm1_context.linear",
                          "single_transformer_blocks.*.norm.linear"),
        "heads_norm_across": False,
        "probe": ("x_embedder", "time_text_embed", "transformer_blocks.0.norm1"),
    },
    "diffusers.LTX2VideoTransformer3DModel": {
        "column": tuple(f"transformer_blocks.*.{a}.{p}" for a in
                        ("attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn",
                         "video_to_audio_attn") for p in _ATTN_COL)
        + ("transformer_blocks.*.ff.net.0.proj", "transformer_blocks.*.audio_ff.net.0.proj"),
        "row": tuple(f"transformer_blocks.*.{a}.to_out.0" for a in
                     ("attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn",
                      "video_to_audio_attn"))
        + ("transformer_blocks.*.ff.net.2", "transformer_blocks.*.audio_ff.net.2"),
        "row_segments": {},
        "heads_norm_across": True,
        "probe": ("proj_in", "time_embed", "transformer_blocks.0.scale_shift_table", "transformer_blocks.0.norm1"),
        "cfg_branch": ("encoder_hidden_states", "audio_encoder_hidden_states"),
    },
}

# encoders (used only when a component is given its own tp > 1)
_T5 = {
    "column": ("encoder.block.*.layer.0.SelfAttention.q", "encoder.block.*.layer.0.SelfAttention.k",
               "encoder.block.*.layer.0.SelfAttention.v", "encoder.block.*.layer.1.DenseReluDense.wi_0",
               "encoder.block.*.layer.1.DenseReluDense.wi_1"),
    "row": ("encoder.block.*.layer.0.SelfAttention.o", "encoder.block.*.layer.1.DenseReluDense.wo"),
    "row_segments": {}, "heads_norm_across": False,
}


def _decoder_lm(prefix: str) -> dict:
    return {
        "column": _paths(f"{prefix}.*.self_attn", ("q_proj", "k_proj", "v_proj"))
        + _paths(f"{prefix}.*.mlp", ("gate_proj", "up_proj")),
        "row": (f"{prefix}.*.self_attn.o_proj", f"{prefix}.*.mlp.down_proj"),
        "row_segments": {}, "heads_norm_across": False,
    }


RULES.update({
    "transformers.T5EncoderModel": _T5,
    "transformers.UMT5EncoderModel": _T5,
    "transformers.CLIPTextModel": {
        "column": _paths("text_model.encoder.layers.*.self_attn", ("q_proj", "k_proj", "v_proj"))
        + ("text_model.encoder.layers.*.mlp.fc1",),
        "row": ("text_model.encoder.layers.*.self_attn.out_proj", "text_model.encoder.layers.*.mlp.fc2"),
        "row_segments": {}, "heads_norm_across": False,
    },
    "transformers.LlamaModel": _decoder_lm("layers"),
    "transformers.Qwen2_5_VLForConditionalGeneration": _decoder_lm("model.language_model.layers"),
    "transformers.Gemma3ForConditionalGeneration": _decoder_lm("model.language_model.layers"),
})


def rules_for(cls: str) -> dict | None:
    return RULES.get(cls)
