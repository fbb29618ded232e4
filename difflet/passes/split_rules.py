"""Per-class Megatron split rules (data only): which linears split by column, which by row.
A family declares its denoisers' rules in its facts (difflet/families/<family>/facts.py);
the text encoders' (transformers classes several families share) are here.

Invariants:
- Globs are module paths inside the component (`*` = one block index), matching diffusers /
  transformers attribute names of the installed versions.
- column: weight [out, in] split on dim 0 (q/k/v/gate/up), bias split; row: split on dim 1
  (out/down), bias added once after the reduction. `segments` says the row input is a
  concatenation (single-stream blocks: [attention, mlp]) each part split on its own.
- column_gather: the per-block modulation (AdaLN) linears: column split, then an all-gather of
  their small [B, k*dim] output over tp, so every block linear is split (memory.py divides
  `params_blocks_linear` by tp).
- `heads_norm_across`: q/k norms over all heads: under TP their sum of squares
  needs an all-reduce over the tp group.
- `probe`: the modules extract-probe keeps: input projections and first-block norm/modulation.
- `cfg_branch`: the inputs whose value differs between the conditional and unconditional pass
  of the family's CFG (passes/cfg_branch.py twins them under cfg2); the host step feeds them
  (difflet/families/<family>/host.py). A class without it is not built under cfg.
- Every linear not listed stays replicated (embedders, modulation, refiner, final projection).
"""
from __future__ import annotations

from typing import Mapping

from difflet.families.split_globs import paths


def _family_rules() -> dict[str, Mapping]:
    """Every registered family's denoiser rules (families/<family>/facts.py `rules`)."""
    from difflet.families import all_facts

    return {cls: rule for facts in all_facts().values() for cls, rule in facts.rules.items()}


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
        "column": paths(f"{prefix}.*.self_attn", ("q_proj", "k_proj", "v_proj"))
        + paths(f"{prefix}.*.mlp", ("gate_proj", "up_proj")),
        "row": (f"{prefix}.*.self_attn.o_proj", f"{prefix}.*.mlp.down_proj"),
        "row_segments": {}, "heads_norm_across": False,
    }


ENCODER_RULES: dict[str, dict] = {
    "transformers.T5EncoderModel": _T5,
    "transformers.UMT5EncoderModel": _T5,
    "transformers.CLIPTextModel": {
        "column": paths("text_model.encoder.layers.*.self_attn", ("q_proj", "k_proj", "v_proj"))
        + ("text_model.encoder.layers.*.mlp.fc1",),
        "row": ("text_model.encoder.layers.*.self_attn.out_proj", "text_model.encoder.layers.*.mlp.fc2"),
        "row_segments": {}, "heads_norm_across": False,
    },
    "transformers.LlamaModel": _decoder_lm("layers"),
    "transformers.Qwen2_5_VLForConditionalGeneration": _decoder_lm("model.language_model.layers"),
    "transformers.Gemma3ForConditionalGeneration": _decoder_lm("model.language_model.layers"),
}


def rules_for(cls: str) -> Mapping | None:
    """The split rules of a class: its family's (denoisers), else the shared encoders' table."""
    return _family_rules().get(cls) or ENCODER_RULES.get(cls)
