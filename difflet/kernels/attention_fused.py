"""The bounded-attention contract on fused SDPA kernels: what the `inductor` backend compiles.

Same contract as attention_ref (the oracle): q [B, H, Sq, D], k/v [B, H, Sk, D], runtime 0-d
int64 bounds [lo, hi); returns out, or (out, lse) with return_stats.

Invariants:
- The S x S score matrix is never materialized: the valid keys become one [1, 1, 1, Sk] key
  mask (O(Sk) memory, broadcast over heads and queries) handed to a fused (flash / memory-
  efficient) SDPA kernel, whose extra memory is O(Sq * D) per head.
- The bounds stay tensors and there is no data-dependent Python control flow, so one exported
  program serves every bound.
- An empty interval gives out = 0 and lse = -inf, set explicitly (the fused kernels' own result
  for an all-masked row is not part of their contract).
- lse is float32 whatever the input dtype: the fused kernels accumulate in float32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _key_mask(lo: torch.Tensor, hi: torch.Tensor, sk: int, device) -> torch.Tensor:
    """[1, 1, 1, Sk] bool: key j is valid iff lo <= j < hi (broadcast, never [Sq, Sk])."""
    j = torch.arange(sk, device=device)
    return ((j >= lo.to(device)) & (j < hi.to(device))).view(1, 1, 1, sk)


def _with_lse(q, k, v, keep, scale):
    """Fused attention returning (out, lse [B, H, Sq] float32) under an additive key mask."""
    bias = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill(~keep, float("-inf"))
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias,
                                                                               scale=scale)
        return out, lse
    # CUDA: the memory-efficient kernel takes an additive bias and returns lse padded to 32 rows.
    bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, scale=scale)
    return out, lse[..., : q.shape[2]]


def bounded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor,
                      hi: torch.Tensor, return_stats: bool = False, scale: float | None = None):
    """Attention of q over the keys with index in [lo, hi), fused (see the module invariants)."""
    keep = _key_mask(lo, hi, k.shape[-2], q.device)
    nonempty = (hi.to(q.device) > lo.to(q.device)).reshape(1, 1, 1, 1)
    if not return_stats:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale)
        return torch.where(nonempty, out, torch.zeros((), dtype=out.dtype, device=out.device))
    out, lse = _with_lse(q, k, v, keep, scale)
    out = torch.where(nonempty, out, torch.zeros((), dtype=out.dtype, device=out.device))
    lse = torch.where(nonempty[..., 0], lse.float(), torch.full((), float("-inf"), device=q.device))
    return out, lse
