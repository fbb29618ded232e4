"""The collectives this package uses, as torch.distributed functional collectives.

Invariants:
- Every op is a functional collective (`torch.distributed._functional_collectives`): it returns
  a new tensor and never mutates its input, so torch.export can trace it into a graph.
- A size-1 group (or group=None) is the identity and issues no collective: one code path for
  every degree, including unsplit.
- Every op waits for its result (`wait_tensor`) before returning, except `rotate`, whose result
  is in flight until the caller passes it to `wait` (so a ring step overlaps compute).
- Ops are over `dim` of a tensor in the caller's layout; the reshapes collectives need (split
  dim first) live here, not at call sites.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

# torch 2.13 names these *_single (its *_tensor names warn, deprecated); torch 2.11, the device
# image's, has only all_gather_tensor / reduce_scatter_tensor: the same c10d functional ops
_all_gather_single = getattr(fc, "all_gather_single", None) or fc.all_gather_tensor
_reduce_scatter_single = getattr(fc, "reduce_scatter_single", None) or fc.reduce_scatter_tensor


def wait(x: torch.Tensor) -> torch.Tensor:
    """The finished result of a collective (a no-op on a plain tensor)."""
    return x.wait() if isinstance(x, fc.AsyncCollectiveTensor) else x  # traced: waits are already in the graph


def size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def rank(group) -> int:
    """This process's position inside `group` (0 when group is None)."""
    return 0 if group is None else dist.get_rank(group)


def all_gather(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim`, in group rank order."""
    if size(group) == 1:
        return x
    return wait(_all_gather_single(x.contiguous(), dim % x.dim(), group))


def reduce_scatter(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """Sum `x` over the group and keep this rank's `dim`-chunk (dim must divide by the size)."""
    if size(group) == 1:
        return x
    return wait(_reduce_scatter_single(x.contiguous(), "sum", dim % x.dim(), group))


def all_reduce(x: torch.Tensor, group) -> torch.Tensor:
    """Sum `x` over the group."""
    if size(group) == 1:
        return x
    return wait(fc.all_reduce(x, "sum", group))


def all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """Equal all-to-all over dim 0: chunk j of dim 0 goes to rank j; the result's chunk i came
    from rank i."""
    if size(group) == 1:
        return x
    return wait(fc.all_to_all_single(x.contiguous(), None, None, group))


def rotate(x: torch.Tensor, group, shift: int = 1) -> torch.Tensor:
    """Send `x` to rank (r + shift) % n and return what rank (r - shift) % n sent (a ring step).

    An uneven all_to_all_single with one non-empty split each way: functional (traceable) and it
    moves exactly one block per rank, like send/recv. The result is in flight: pass it to `wait`.
    """
    n = size(group)
    if n == 1 or shift % n == 0:
        return x
    r, rows = rank(group), x.shape[0]
    dst, src = (r + shift) % n, (r - shift) % n
    send = [rows if j == dst else 0 for j in range(n)]
    recv = [rows if j == src else 0 for j in range(n)]
    return fc.all_to_all_single(x.contiguous(), recv, send, group)
