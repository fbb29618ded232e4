"""The bounded-attention contract (README.md, attention_ref.py) on NKI's attention_cte kernel.

Release assumed: Neuron SDK 2.29 = aws-neuron/nki-library tag 2.29, read from
src/nkilib_src/nkilib/core/attention/attention_cte.py (the kernel) and attention_cte_torch.py
(its torch reference; same signature on nki-library main, 2026-04-13). What this adapter relies on:
- Import `from nkilib.core.attention.attention_cte import attention_cte` (the package's
  __init__.py holds only the license; NxD Inference's modeling_flux.py (models/diffusers, its FLUX app)
  imports it this way), called as `attention_cte[2](...)` under LNC=2.
- Heads folded into batch: q `[BH, Sq, d]` (tp_q=True), k `[BH, Sk, d]` (tp_k=True: the kernel
  transposes), v `[BH, Sk, d]`, out `[BH, Sq, d]` (tp_out=False) in q's dtype; d <= 128.
- bound_min/bound_max: float32 `[Sq, 1]` (the kernel asserts this shape; its test casts the
  int bounds to float32); query i attends keys j with bound_min[i] <= j < bound_max[i]. The
  kernel reshapes them to (128, Sq/128), so Sq is a multiple of 128, and on this range_select
  path it asserts scale == 1.0: q is pre-scaled here.
- Masked scores: the kernel fills -3.4028235e38 (`_FLOAT32_MIN`, finite: an all-masked row
  averages every value), its torch reference fills -inf (the row is NaN). Neither is the
  contract's empty interval, so that case is set to (0, -inf) here by a torch.where on the bounds.
- `cache_softmax=True` (Sq a multiple of 128) returns (out, neg_max, recip): neg_max = -row max
  and recip = 1 / row sum of exp(s - max), float32 `[BH, 128, Sq/128]`, query row g*128 + t at
  [:, t, g]; `out` stays normalized. `kernel_stats` maps these to lse = max + log(sum).
- Without bounds (every key valid by construction) the call is NxD Inference FLUX's:
  `attention_cte[2](q, k, v, 1/sqrt(d), causal_mask=False, tp_q=True, tp_k=True, tp_out=False)`.
Later releases (aws-neuron-sdk docs v2.30.0+, nki/library/api/attention-cte.rst) add
`cp_striped_input` and `skip_output_normalization` (then out is unnormalized and the third
output is the raw sum, not 1/sum) and v2.32.0 `position_bias`; 2.29 has neither, so this adapter
passes neither. The 2.29 docs give the bounds' shape as (batch_size, seqlen_q); the 2.29 kernel
source asserts (seqlen_q, 1), which is followed here.

Masked calls pad q and k/v rows to one length L (a multiple of 128, >= Sq and Sk) with zeros:
the padded keys lie at index >= Sk, outside every bound (hi is clamped to Sk), and the padded
query rows are dropped, so each masked call has equal Q/K lengths — the only case nkilib's own
test covers (test_attention_cte.py: "sequence packing requires seqlen_q == seqlen_kv").
No data-dependent control flow: one traced program serves every bound.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

TILE = 128  # SBUF partitions: the statistics tile, the bounds' reshape and cache_softmax's Sq multiple


def nki_kernel() -> Callable:
    """The real kernel under LNC=2; ImportError without the Neuron SDK (nkilib is not on PyPI)."""
    # follows neuronx-distributed-inference modeling_flux.py, models/diffusers FLUX app (its import line)
    from nkilib.core.attention.attention_cte import attention_cte

    return attention_cte[2]


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """[BH, S, d] zero-padded to n rows."""
    pad = n - t.shape[1]
    return t if pad == 0 else torch.cat([t, t.new_zeros(t.shape[0], pad, t.shape[2])], dim=1)


def kernel_bounds(lo: torch.Tensor, hi: torch.Tensor, rows: int, sk: int):
    """float32 bound_min/bound_max [rows, 1] of one interval for every query row; hi clamped to
    the real key count so zero-padded keys stay outside."""
    ones = torch.ones(rows, 1, dtype=torch.float32, device=lo.device)
    hi = torch.clamp(hi.to(torch.int64), max=sk)
    return ones * lo.to(torch.float32), ones * hi.to(torch.float32)


def kernel_stats(neg_max: torch.Tensor, recip: torch.Tensor, sq: int) -> torch.Tensor:
    """attention_cte's cache_softmax statistics (neg_max = -max, recip = 1/sum, float32
    [BH, 128, Sq_pad/128], row g*128 + t at [:, t, g]) -> the contract's lse [BH, sq] float32,
    lse = max + log(sum) = -neg_max - log(recip)."""
    bh = neg_max.shape[0]
    rows = lambda t: t.float().transpose(1, 2).reshape(bh, -1)[:, :sq]  # noqa: E731  tile-major -> rows
    return -rows(neg_max) - torch.log(rows(recip))


def bounded_attention_nki(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor,
                          hi: torch.Tensor, return_stats: bool = False, scale: float | None = None,
                          whole: bool = False, kernel: Callable | None = None):
    """The contract of attention_ref.bounded_attention computed by `kernel` (default: 2.29's
    attention_cte[2]). `whole`: the caller guarantees [lo, hi) is every key, so the kernel runs
    without bounds (NxD Inference FLUX's call) and lo/hi are not read."""
    kernel = kernel or nki_kernel()
    b, h, sq, d = q.shape
    sk = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qf, kf, vf = (t.reshape(b * h, t.shape[2], d) for t in (q, k, v))
    flags = dict(causal_mask=False, tp_q=True, tp_k=True, tp_out=False)
    if return_stats:
        flags["cache_softmax"] = True
    if whole:
        rows = -(-sq // TILE) * TILE if return_stats else sq  # cache_softmax: Sq a multiple of 128
        # NxD Inference modeling_flux.py attention_wrapper_sharded_without_swap's call (no bounds)
        res = kernel(_rows(qf, rows), kf, vf, scale, **flags)
    else:
        rows = -(-max(sq, sk) // TILE) * TILE
        qs = (qf.float() * scale).to(q.dtype)  # range_select path: the kernel asserts scale == 1.0
        bmin, bmax = kernel_bounds(lo, hi, rows, sk)
        # nki-library 2.29 src/nkilib_src/nkilib/core/attention/attention_cte.py (sequence-packing bounds)
        res = kernel(_rows(qs, rows), _rows(kf, rows), _rows(vf, rows), 1.0, bound_min=bmin, bound_max=bmax,
                     **flags)
    out = (res[0] if return_stats else res)[:, :sq].reshape(b, h, sq, d)
    lse = kernel_stats(res[1], res[2], sq).reshape(b, h, sq) if return_stats else None
    if not whole:  # the kernel's fill gives no zeros for an empty interval: the contract's values
        empty = hi <= lo
        out = torch.where(empty, torch.zeros((), dtype=out.dtype, device=out.device), out)
        if return_stats:
            lse = torch.where(empty, torch.full((), float("-inf"), device=lse.device), lse)
    out = out.to(q.dtype)
    return (out, lse) if return_stats else out
