"""A CPU double of nkilib's attention_cte, encoding what nki-library tag 2.29 does.

Sources (aws-neuron/nki-library, tag 2.29):
- src/nkilib_src/nkilib/core/attention/attention_cte.py, `attention_cte`: the signature (copied
  below, so an argument 2.29 lacks, e.g. skip_output_normalization, is a TypeError as on the
  real kernel); the asserts it makes (bounds both or neither, shape (seqlen_q, 1); scale == 1.0
  on the range_select path; seqlen_q % 128 == 0 with cache_softmax; d <= 128); the bounds'
  reshape to (128, seqlen_q / 128) in `_setup_range_select_bounds`; the masked-score fill
  `_FLOAT32_MIN` (range_select's on_false_value).
- src/nkilib_src/nkilib/core/attention/attention_cte_torch.py, `attention_cte_torch_ref`: the
  math, line for line for the features Difflet uses (tp_q/tp_k/tp_out transposes, the
  bounds as int32 (seqlen_q, 1), the -inf fill, cache_softmax's neg_max = -max and
  recip = 1/sum reshaped (bs, seq_grps, 128).transpose(1, 2), out normalized by sum).
- test/integration/nkilib/core/attention/test_attention_cte.py: bounds built as float32.
`fill` picks the reference's -inf (an empty row is NaN) or the kernel's _FLOAT32_MIN (an empty
row averages every value). Features Difflet never uses (prefix caching, sink, sliding window,
context parallel, causal) are refused, not modelled. `calls` records each call's arguments.
"""
from __future__ import annotations

import torch

FLOAT32_MIN = torch.finfo(torch.float32).min  # attention_cte.py _FLOAT32_MIN = -3.4028235e38 (as float32)
TILE = 128  # attention_cte.py _Q_GRP_SZ / cache_softmax_tile_size


class AttentionCteDouble:
    """Callable as `attention_cte[2](...)` (the adapter receives the already-indexed kernel)."""

    def __init__(self, fill: float = float("-inf")) -> None:
        self.fill, self.calls = fill, []

    def __call__(self, q, k, v, scale=1.0, causal_mask=True, k_prior=None, v_prior=None, prior_used_len=None,
                 sink=None, sliding_window=None, tp_q=True, tp_k=False, tp_out=False, cache_softmax=False,
                 softmax_dtype=torch.float32, mm_out_dtype=torch.float32, cp_offset=None, global_cp_deg=None,
                 cp_strided_q_slicing=False, bound_min=None, bound_max=None):
        self.calls.append(dict(q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape), scale=scale,
                               causal_mask=causal_mask, tp_q=tp_q, tp_k=tp_k, tp_out=tp_out,
                               cache_softmax=cache_softmax, bound_min=bound_min, bound_max=bound_max,
                               dtype=q.dtype))
        assert k_prior is None and v_prior is None and prior_used_len is None and sink is None
        assert not sliding_window and cp_offset is None and global_cp_deg is None and not causal_mask
        assert (bound_min is None) == (bound_max is None), "bound_min and bound_max must both be set or both be None"
        out_dtype = q.dtype  # result = nl.ndarray(shape=out_shape, dtype=q.dtype)
        q, k, v = q.to(torch.float32), k.to(torch.float32), v.to(torch.float32)
        if not tp_q:
            q = q.transpose(1, 2)
        if tp_k:
            k = k.transpose(1, 2)  # [bs, d, seqlen_k]
        bs, d = q.shape[0], v.shape[2]
        seqlen_q, seqlen_k = q.shape[1], k.shape[2]
        assert d <= 128, "we do not support head_dim > 128"
        assert tuple(v.shape) == (k.shape[0], seqlen_k, d)
        mask = q.new_full((seqlen_q, seqlen_k), 0)
        if bound_min is not None:
            assert tuple(bound_min.shape) == (seqlen_q, 1) and tuple(bound_max.shape) == (seqlen_q, 1)
            assert bound_min.dtype == torch.float32 and bound_max.dtype == torch.float32  # test_attention_cte.py
            assert seqlen_q % TILE == 0, "bounds reshape to (128, num_grps) in _setup_range_select_bounds"
            assert scale == 1.0, "range_select path doesn't support scale != 1.0"
            lo = bound_min.to(torch.int32).reshape(seqlen_q, 1)
            hi = bound_max.to(torch.int32).reshape(seqlen_q, 1)
            kv_idx = torch.arange(seqlen_k, dtype=torch.int32).unsqueeze(0)
            mask = mask.masked_fill((kv_idx < lo) | (kv_idx >= hi), float("-inf"))
        qk = q @ k
        qk *= scale
        qk += mask[None, :, :]
        qk = torch.where(torch.isneginf(mask)[None], torch.full_like(qk, self.fill), qk)  # range_select replaces
        if cache_softmax:
            assert seqlen_q % TILE == 0, "For cache softmax, kernel currently expects seqlen_q multiple of 128"
            max_value = torch.max(qk, dim=-1, keepdim=True).values
            exp_values = torch.exp(qk - max_value)
            sum_exp = torch.sum(exp_values, dim=-1, keepdim=True)
            out = (exp_values / sum_exp) @ v
            out = out.transpose(1, 2) if tp_out else out
            grps = seqlen_q // TILE
            neg_max = (-max_value).reshape(bs, grps, TILE).transpose(1, 2).to(softmax_dtype)
            recip = torch.reciprocal(sum_exp).reshape(bs, grps, TILE).transpose(1, 2).to(softmax_dtype)
            return out.to(out_dtype), neg_max, recip
        out = torch.softmax(qk, dim=-1) @ v
        return (out.transpose(1, 2) if tp_out else out).to(out_dtype)
