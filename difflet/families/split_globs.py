"""Glob builders the families' split rules share (torch-free; passes/split_rules.py documents
the rule keys: column, row, row_segments, column_gather, heads_norm_across, probe, cfg_branch).

Invariant: globs are module paths inside a component (`*` = one block index), matching the
installed diffusers / transformers attribute names.
"""
from __future__ import annotations

ATTN_COL = ("to_q", "to_k", "to_v")
JOINT_COL = ATTN_COL + ("add_q_proj", "add_k_proj", "add_v_proj")


def paths(prefix: str, names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"{prefix}.{n}" for n in names)


# the dual-stream (MMDiT) blocks' joint attention projections
MMDIT_COLUMN = paths("transformer_blocks.*.attn", JOINT_COL)
MMDIT_ROW = ("transformer_blocks.*.attn.to_out.0", "transformer_blocks.*.attn.to_add_out")


def dual_single_stream(single: str = "single_transformer_blocks") -> dict:
    """Rules of a dual- then single-stream transformer whose blocks use diffusers' FeedForward
    (`ff` / `ff_context`) and single blocks a fused [attention, mlp] proj_out."""
    return {
        "column": MMDIT_COLUMN + ("transformer_blocks.*.ff.net.0.proj", "transformer_blocks.*.ff_context.net.0.proj")
        + paths(f"{single}.*.attn", ATTN_COL) + (f"{single}.*.proj_mlp",),
        "row": MMDIT_ROW + ("transformer_blocks.*.ff.net.2", "transformer_blocks.*.ff_context.net.2"),
        "row_segments": {f"{single}.*.proj_out": ("attn", "mlp")},
        "column_gather": ("transformer_blocks.*.norm1.linear", "transformer_blocks.*.norm1_context.linear",
                          f"{single}.*.norm.linear"),
        "heads_norm_across": False,
    }
