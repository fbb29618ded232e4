"""`ParallelLinear`: one rank's shard of an nn.Linear (column, row, column_gather), as a module;
`ParallelRMSNorm`: an RMS norm over features that a column linear left sharded over tp.

Invariants:
- Built from the full Linear once (`from_linear`), holding only this rank's presharded weight:
  loading the rank's safetensors never reshards, and the module's parameter names are the
  Linear's (`weight`, `bias`), so checkpoints, programs and FQNs line up.
- column: output features [i*out/n, (i+1)*out/n), bias sliced; no collective.
  column_gather: column, then all-gather the output's last dim: every rank holds the full output
  (AdaLN modulation: small [B, k*dim] tensors).
  row: input features [i*in/n, ...) of each of `segments` (the input is a concatenation whose
  parts are each split over ranks; one segment = plain Megatron row), then all-reduce, or with
  `sp` reduce-scatter tokens; the whole bias is added once, after the sum.
- SP (`sp=True`): activations outside the linears are token shards of each `token_segments`
  part (a joint [text, visual] sequence is sharded per stream). A column linear all-gathers
  tokens before its matmul and restores the segment-major order; a row linear reorders to
  rank-major before its reduce-scatter, so each rank gets back exactly its shards.
- ParallelRMSNorm normalizes this rank's contiguous feature shard by the RMS over ALL features:
  the sum of squares is all-reduced over tp (q/k norms "across heads" after a column split);
  its weight is the same shard of the norm's weight. It computes in float32 like torch's norm.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from difflet.parallel import comm
from difflet.parallel.linears import shard

STYLES = ("column", "column_gather", "row")


def _row_shard(weight: torch.Tensor, segments: tuple[int, ...], index: int, parts: int) -> torch.Tensor:
    """Columns of W for this rank: its chunk of every input segment, concatenated in order."""
    if sum(segments) != weight.shape[1]:
        raise ValueError(f"row segments {segments} do not add up to the input width {weight.shape[1]}")
    pieces = weight.split(list(segments), dim=1)
    return torch.cat([shard(p, 1, index, parts) for p in pieces], dim=1).contiguous()


def sp_gather(x: torch.Tensor, group, token_segments: tuple[int, ...] | None) -> torch.Tensor:
    """Token shards [B, sum(seg)/n, C] -> all tokens [B, sum(seg), C] in segment-major order."""
    n = comm.size(group)
    if n == 1:
        return x
    full = comm.all_gather(x, 1, group)  # rank-major: [r0 parts..., r1 parts..., ...]
    if not token_segments or len(token_segments) == 1:
        return full
    local = [s // n for s in token_segments]
    per_rank = [blk.split(local, dim=1) for blk in full.chunk(n, dim=1)]
    return torch.cat([per_rank[r][s] for s in range(len(local)) for r in range(n)], dim=1)


def sp_reduce_scatter(x: torch.Tensor, group, token_segments: tuple[int, ...] | None) -> torch.Tensor:
    """Partial sums over all tokens (segment-major) -> this rank's summed token shards."""
    n = comm.size(group)
    if n == 1:
        return x
    if token_segments and len(token_segments) > 1:
        parts = [p.chunk(n, dim=1) for p in x.split(list(token_segments), dim=1)]
        x = torch.cat([parts[s][r] for r in range(n) for s in range(len(parts))], dim=1)
    return comm.reduce_scatter(x, 1, group)


def sp_shard(x: torch.Tensor, group, token_segments: tuple[int, ...] | None = None) -> torch.Tensor:
    """All tokens (replicated) -> this rank's shard of every segment; no communication."""
    n = comm.size(group)
    if n == 1:
        return x
    segs = token_segments or (x.shape[1],)
    r = comm.rank(group)
    return torch.cat([shard(p, 1, r, n) for p in x.split(list(segs), dim=1)], dim=1)


class ParallelLinear(torch.nn.Module):
    """This rank's shard of a Linear (see module docstring). `group` is the tp process group."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, style: str, group,
                 sp: bool = False, token_segments: tuple[int, ...] | None = None) -> None:
        super().__init__()
        if style not in STYLES:
            raise ValueError(f"unknown split style {style!r}; expected one of {STYLES}")
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        self.style, self.group, self.sp = style, group, sp
        self.token_segments = token_segments

    @classmethod
    def from_linear(cls, lin: torch.nn.Linear, style: str, group, index: int, parts: int,
                    segments: tuple[int, ...] | None = None, sp: bool = False,
                    token_segments: tuple[int, ...] | None = None) -> "ParallelLinear":
        w, b = lin.weight.detach(), None if lin.bias is None else lin.bias.detach()
        if style in ("column", "column_gather"):
            w, b = shard(w, 0, index, parts), None if b is None else shard(b, 0, index, parts).clone()
        else:
            w = _row_shard(w, tuple(segments or (w.shape[1],)), index, parts)
            b = None if b is None else b.clone()
        return cls(w.clone(), b, style, group, sp=sp and style != "column_gather",
                   token_segments=token_segments)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.style == "row":
            partial = F.linear(x, self.weight)
            out = sp_reduce_scatter(partial, self.group, self.token_segments) if self.sp \
                else comm.all_reduce(partial, self.group)
            return out if self.bias is None else out + self.bias
        if self.sp:
            x = sp_gather(x, self.group, self.token_segments)
        out = F.linear(x, self.weight, self.bias)
        return comm.all_gather(out, -1, self.group) if self.style == "column_gather" else out

    def extra_repr(self) -> str:
        return f"{self.style}, weight={tuple(self.weight.shape)}, sp={self.sp}"


class ParallelRMSNorm(torch.nn.Module):
    """This rank's feature shard of an nn.RMSNorm over the last dim (see module docstring)."""

    def __init__(self, weight: torch.Tensor | None, eps: float | None, full_dim: int, group) -> None:
        super().__init__()
        self.weight = None if weight is None else torch.nn.Parameter(weight, requires_grad=False)
        self.eps, self.full_dim, self.group = eps, full_dim, group

    @classmethod
    def from_norm(cls, norm: torch.nn.RMSNorm, group, index: int, parts: int) -> "ParallelRMSNorm":
        shape = tuple(norm.normalized_shape)
        if len(shape) != 1:
            raise ValueError(f"ParallelRMSNorm shards one feature dim, not normalized_shape {shape}")
        w = None if norm.weight is None else shard(norm.weight.detach(), 0, index, parts).clone()
        return cls(w, norm.eps, shape[0], group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        squares = comm.all_reduce(x32.pow(2).sum(-1, keepdim=True), self.group)  # over every feature
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        out = x32 * torch.rsqrt(squares / self.full_dim + eps)
        return (out if self.weight is None else out * self.weight.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return f"full_dim={self.full_dim}, local={None if self.weight is None else tuple(self.weight.shape)}"
