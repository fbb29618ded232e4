"""Megatron TP linears and SP regions, as functions over groups.

Invariants:
- Weights follow torch's Linear layout [out, in]. A column-parallel shard holds rows
  [i*out/n, (i+1)*out/n) of W and the same slice of the bias; a row-parallel shard holds
  columns [i*in/n, (i+1)*in/n) of W and the *whole* bias, added once after the reduction.
- column(row(...)) pairs need no collective between them: the column output's feature shard is
  exactly the row input's feature shard.
- SP: activations between linears are token shards (dim `seq_dim`, rank order). `sp_enter`
  all-gathers tokens before a column linear; `row_parallel_linear(..., sp=True)` reduce-scatters
  tokens after the row linear instead of all-reducing, so every rank ends with its own token
  shard of the full sum. Without SP the row linear all-reduces and outputs stay replicated.
- With size-1 groups every function is the unsplit computation.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from difflet.parallel import comm


def shard(t: torch.Tensor, dim: int, index: int, parts: int) -> torch.Tensor:
    """The `index`-th of `parts` equal contiguous chunks of `t` along `dim` (must divide)."""
    if t.shape[dim] % parts:
        raise ValueError(f"dim {dim} of size {t.shape[dim]} does not split into {parts} parts")
    return t.chunk(parts, dim=dim)[index].contiguous()


def shard_linear(weight: torch.Tensor, bias: torch.Tensor | None, style: str, index: int, parts: int):
    """(weight, bias) of this rank's shard of a Linear for `style` 'column' or 'row'."""
    if style == "column":
        return shard(weight, 0, index, parts), (None if bias is None else shard(bias, 0, index, parts))
    if style == "row":
        return shard(weight, 1, index, parts), bias
    raise ValueError(f"unknown split style {style!r}; expected 'column' or 'row'")


def column_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """Replicated input -> this rank's output-feature shard. No collective."""
    return F.linear(x, weight, bias)


def row_parallel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, group,
                        sp: bool = False, seq_dim: int = 1):
    """Input-feature shard -> full output: all-reduce (replicated) or, with sp, reduce-scatter
    over `seq_dim` (this rank's token shard). The bias is added once, after the sum."""
    partial = F.linear(x, weight)
    out = comm.reduce_scatter(partial, seq_dim, group) if sp else comm.all_reduce(partial, group)
    return out if bias is None else out + bias


def sp_enter(x: torch.Tensor, group, seq_dim: int = 1) -> torch.Tensor:
    """Token shard -> all tokens (the all-gather that opens an SP region's linears)."""
    return comm.all_gather(x, seq_dim, group)


def sp_scatter(x: torch.Tensor, group, seq_dim: int = 1) -> torch.Tensor:
    """All tokens (replicated) -> this rank's token shard, no communication (e.g. model input)."""
    return shard(x, seq_dim, comm.rank(group), comm.size(group))
