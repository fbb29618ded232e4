"""The bounded-attention contract (README.md, attention_ref.py) on NKI's attention_cte kernel.

Kernel: `nkilib.core.attention.attention_cte` (aws-neuron/nki-library, docs
`nki/library/api/attention-cte.rst`, Neuron SDK 2.29), called as `attention_cte[2](...)` under
LNC=2. Its layout (from nkilib's own torch reference, attention_cte_torch.py): heads folded into
batch; q `[BH, Sq, d]` (tp_q=True), k `[BH, d, Sk]` (tp_k=False), v `[BH, Sk, d]`, out
`[BH, Sq, d]`; d <= 128. Each query attends keys in `[bound_min, bound_max)`, bounds float32
`[Sq, 1]` (2026-04 release) or `[BH, Sq, 1]` (later). With `cache_softmax=True` it also returns
`neg_max = -row max` and `recip = 1 / row sum` as float32 `[BH, 128, Sq / 128]` (query row
`g * 128 + t` at `[:, t, g]`), which needs Sq to be a multiple of 128; with
`skip_output_normalization=True` the output is the unnormalized sum instead.

What the adapter adds (all plain torch, run on CPU by tests/test_neuron_attention_nki.py with a
torch stand-in for the kernel; on a trn2 host the same tests run the real kernel):
- q is pre-scaled and the kernel gets scale=1.0 (the bounded path is tested upstream that way);
- Sq is padded to a multiple of 128 with zero queries, whose rows are dropped afterwards;
- `kernel_stats` turns (out, neg_max, recip) into the contract's (out, lse), lse = m + log(l) —
  the one place that knows the kernel's statistics currency, so a change of either side is one edit;
- an empty interval gives the contract's values (out = 0, lse = -inf): the kernel fills masked
  scores with a large finite negative number, so its stats for an empty row are not those.
No data-dependent control flow: the empty-interval fix is a `torch.where` on the bounds.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

TILE = 128  # SBUF partitions: attention_cte's statistics tile and its cache_softmax Sq multiple


def nki_kernel() -> Callable:
    """The real kernel under LNC=2; ImportError without the Neuron SDK (nkilib is not on PyPI)."""
    from nkilib.core.attention import attention_cte

    return attention_cte[2]


def kernel_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """Contract tensors [B, H, S, D] -> kernel tensors: (q pre-scaled [BH, Sq_pad, D], k [BH, D, Sk],
    v [BH, Sk, D]) with Sq padded up to a multiple of TILE by zero queries."""
    b, h, sq, d = q.shape
    qs = (q.float() * scale).to(q.dtype).reshape(b * h, sq, d)
    pad = -sq % TILE
    if pad:
        qs = torch.cat([qs, qs.new_zeros(b * h, pad, d)], dim=1)
    kt = k.reshape(b * h, k.shape[2], d).transpose(1, 2).contiguous()
    return qs, kt, v.reshape(b * h, v.shape[2], d)


def kernel_bounds(lo: torch.Tensor, hi: torch.Tensor, rows: int, batch: int | None = None):
    """float32 bound_min/bound_max of one interval for every query row: [rows, 1], or
    [batch, rows, 1] for releases whose bounds carry the folded batch."""
    shape = (rows, 1) if batch is None else (batch, rows, 1)
    ones = torch.ones(shape, dtype=torch.float32, device=lo.device)
    return ones * lo.to(torch.float32), ones * hi.to(torch.float32)


def kernel_stats(out: torch.Tensor, neg_max: torch.Tensor, recip: torch.Tensor, normalized: bool,
                 sq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel (out [BH, Sq_pad, D], neg_max/recip [BH, TILE, Sq_pad/TILE]) -> contract float32
    (out, lse) over the first `sq` rows, [BH, sq, ...]. `normalized`: whether `out` was divided
    by the row sum (skip_output_normalization=False)."""
    bh = out.shape[0]
    m = (-neg_max.float()).transpose(1, 2).reshape(bh, -1)[:, :sq]
    l = torch.reciprocal(recip.float()).transpose(1, 2).reshape(bh, -1)[:, :sq]
    o = out.float()[:, :sq]
    norm = o if normalized else o / torch.where(l > 0, l, torch.ones_like(l)).unsqueeze(-1)
    return norm, m + torch.log(l)


def bounded_attention_nki(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor,
                          hi: torch.Tensor, return_stats: bool = False, scale: float | None = None,
                          kernel: Callable | None = None, batched_bounds: bool = False,
                          skip_normalization: bool = True):
    """The contract of attention_ref.bounded_attention, computed by `kernel` (default: NKI's
    attention_cte[2]). `batched_bounds`: the kernel release takes bounds [BH, Sq, 1];
    `skip_normalization`: the release has skip_output_normalization (the output is then divided
    by the row sum here)."""
    kernel = kernel or nki_kernel()
    b, h, sq, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qk, kt, vk = kernel_layout(q, k, v, scale)
    bmin, bmax = kernel_bounds(lo, hi, qk.shape[1], b * h if batched_bounds else None)
    extra = {"skip_output_normalization": True} if skip_normalization else {}
    out, neg_max, recip = kernel(qk, kt, vk, scale=1.0, causal_mask=False, tp_q=True, tp_k=False,
                                 tp_out=False, cache_softmax=True, bound_min=bmin, bound_max=bmax, **extra)
    norm, lse = kernel_stats(out, neg_max, recip, not skip_normalization, sq)
    empty = hi <= lo  # the kernel's finite mask fill gives no zeros here: the contract's values instead
    norm = torch.where(empty, torch.zeros_like(norm), norm)
    lse = torch.where(empty, torch.full_like(lse, float("-inf")), lse)
    shape = (b, h, sq)
    out4 = norm.reshape(*shape, d).to(q.dtype)
    if return_stats:
        return out4, lse.reshape(shape)
    return out4
