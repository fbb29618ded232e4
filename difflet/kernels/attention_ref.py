"""The fused attention contract, torch reference: softmax attention over one interval of keys.

Contract (every backend kernel implements exactly this):
  q [B, H, Sq, D], k/v [B, H, Sk, D]; lo/hi 0-d int64 tensors. Key j takes part in query i's
  softmax iff lo <= j < hi; other keys get weight exactly 0. The scale is 1/sqrt(D) unless given.
  out[b,h,i] = sum_j p_ij v_j with p_ij = exp(s_ij - m_i) / l_i over valid j, where
  s = scale * q.k, m_i = max over valid j of s_ij, l_i = sum over valid j of exp(s_ij - m_i).
  With return_stats: (out, lse) where lse [B, H, Sq] float32 = m_i + log(l_i), the log-sum-exp
  of the valid scores (what fused flash / memory-efficient kernels return), so partials over
  disjoint key sets merge exactly (merge_partials).
  An empty interval gives out = 0, lse = -inf (never NaN).

This file is the oracle; attention_fused.py is what compiled programs call. The bound is a tensor and there is no data-dependent Python control flow, so one exported
program serves every bound.
"""
from __future__ import annotations

import math

import torch


def bounded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor,
                      hi: torch.Tensor, return_stats: bool = False, scale: float | None = None):
    """Attention of q over the keys with index in [lo, hi) (see the module contract)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    # Stats in float32 whatever the input dtype: that is what the fused kernels accumulate in.
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    j = torch.arange(k.shape[-2], device=q.device)
    valid = (j >= lo) & (j < hi)
    s = s.masked_fill(~valid, float("-inf"))
    m = s.amax(dim=-1)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # empty interval: no NaN
    p = torch.exp(s - m_safe.unsqueeze(-1))
    l = p.sum(dim=-1)
    acc = torch.matmul(p, v.float())
    out = acc / torch.where(l > 0, l, torch.ones_like(l)).unsqueeze(-1)
    if return_stats:
        lse = torch.where(l > 0, m_safe + torch.log(torch.where(l > 0, l, torch.ones_like(l))),
                          torch.full_like(l, float("-inf")))
        return out.to(q.dtype), lse
    return out.to(q.dtype)


def merge_partials(parts):
    """Combine `(out, lse)` partials over disjoint key sets into `(out, lse)` of their union
    (out float32). Associative, so a ring can fold partials one at a time; all-empty -> (0, -inf)."""
    lses = torch.stack([lse.float() for _, lse in parts])
    lse = torch.logsumexp(lses, dim=0)  # all -inf -> -inf
    lse_safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    out = sum(o.float() * torch.exp(li.float() - lse_safe).unsqueeze(-1) for o, li in parts)
    return out, lse
