"""The NKI bounded-attention adapter (difflet/kernels/attention_nki.py) against the contract.

Oracles: the contract's torch reference (attention_ref.bounded_attention, itself checked against
dense-mask SDPA in test_kernels_attention.py) and merge_partials. On this CPU host the NKI kernel
is replaced by `attention_cte_standin`, a torch STAND-IN written here from nkilib's documented
semantics (layout, float32 bounds, finite mask fill, neg_max/recip in [BH, 128, Sq/128]); it is
not the kernel, so these tests check the adapter's reshaping, padding, bounds and statistics
conversion only. The cases marked `on_trn2` run the real attention_cte[2] and skip elsewhere.
fp32 tolerance 1e-5: the stand-in and the reference compute the same float32 sums in different
orders; a wrong layout, scale or statistic gives errors of order 1e-1.
"""
from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from difflet.kernels.attention_nki import TILE, bounded_attention_nki, kernel_stats
from difflet.kernels.attention_ref import bounded_attention, merge_partials

HAS_NKI = importlib.util.find_spec("nkilib") is not None and importlib.util.find_spec("neuronxcc") is not None
on_trn2 = pytest.mark.skipif(not HAS_NKI, reason="needs a trn2 host with the Neuron SDK 2.29 "
                             "(nkilib + neuronx-cc); PyPI carries only placeholders")
MASK_FILL = -30000.0  # a large finite negative, as the kernel fills masked scores (not -inf)


def attention_cte_standin(q, k, v, scale=1.0, causal_mask=True, tp_q=True, tp_k=False, tp_out=False,
                          cache_softmax=False, bound_min=None, bound_max=None, skip_output_normalization=False):
    """A torch STAND-IN for nkilib attention_cte (documented semantics; see module docstring)."""
    assert tp_q and not tp_k and not tp_out and not causal_mask and cache_softmax
    bh, sq, _ = q.shape
    assert sq % TILE == 0, "cache_softmax needs Sq to be a multiple of 128"
    s = (q.float() @ k.float()) * scale  # [BH, Sq, Sk]
    j = torch.arange(k.shape[2], dtype=torch.float32)
    lo = bound_min.reshape(-1, sq, 1) if bound_min.dim() == 3 else bound_min.reshape(1, sq, 1)
    hi = bound_max.reshape(-1, sq, 1) if bound_max.dim() == 3 else bound_max.reshape(1, sq, 1)
    s = torch.where((j >= lo) & (j < hi), s, torch.full_like(s, MASK_FILL))
    mx = s.amax(-1, keepdim=True)
    p = torch.exp(s - mx)
    total = p.sum(-1, keepdim=True)
    out = p @ v.float() if skip_output_normalization else (p / total) @ v.float()
    tiles = lambda t: t.reshape(bh, sq // TILE, TILE).transpose(1, 2)  # noqa: E731  [BH, 128, Sq/128]
    return out.to(q.dtype), tiles(-mx), tiles(1.0 / total)


def _qkv(seed, b=1, h=3, sq=40, sk=40, d=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=g).to(dtype) for n in (sq, sk, sk))


CASES = [(0, 40), (0, 1), (5, 33), (39, 40), (0, 24)]


@pytest.mark.parametrize("skip_norm", [True, False])
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("lo,hi", CASES)
def test_adapter_with_the_standin_matches_the_contract(lo, hi, batched, skip_norm):
    q, k, v = _qkv(lo * 41 + hi)
    got = bounded_attention_nki(q, k, v, torch.tensor(lo), torch.tensor(hi), return_stats=True,
                                kernel=attention_cte_standin, batched_bounds=batched, skip_normalization=skip_norm)
    want = bounded_attention(q, k, v, torch.tensor(lo), torch.tensor(hi), return_stats=True)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_unequal_query_and_key_lengths_and_padding_rows():
    q, k, v = _qkv(7, sq=130, sk=57)  # Sq padded to 256 inside; keys fewer than queries
    got = bounded_attention_nki(q, k, v, torch.tensor(3), torch.tensor(50), kernel=attention_cte_standin)
    torch.testing.assert_close(got, bounded_attention(q, k, v, torch.tensor(3), torch.tensor(50)),
                               atol=1e-5, rtol=1e-5)


def test_empty_interval_gives_the_contracts_zeros_not_the_kernels_fill():
    q, k, v = _qkv(3)
    out, lse = bounded_attention_nki(q, k, v, torch.tensor(9), torch.tensor(9), return_stats=True,
                                     kernel=attention_cte_standin)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_partials_merge_exactly_for_ring():
    q, k, v = _qkv(2)
    parts = [bounded_attention_nki(q, k, v, torch.tensor(a), torch.tensor(b), return_stats=True,
                                   kernel=attention_cte_standin) for a, b in [(0, 13), (13, 14), (14, 40)]]
    whole = bounded_attention(q, k, v, torch.tensor(0), torch.tensor(40))
    torch.testing.assert_close(merge_partials(parts)[0], whole, atol=1e-5, rtol=1e-5)


def test_kernel_stats_reads_the_tile_major_layout():
    bh, sq = 2, 2 * TILE
    rows = torch.arange(bh * sq, dtype=torch.float32).reshape(bh, sq)  # row max = its own index
    tiles = (-rows).reshape(bh, 2, TILE).transpose(1, 2)
    _, lse = kernel_stats(torch.zeros(bh, sq, 4), tiles, torch.full_like(tiles, 0.5), False, sq - 3)
    # lse = row max + log(row sum); row sum = 1 / 0.5
    torch.testing.assert_close(lse, rows[:, :sq - 3] + math.log(2.0))


@on_trn2
@pytest.mark.parametrize("lo,hi", CASES)
def test_real_kernel_matches_the_contract_on_trn2(lo, hi):
    import torch_xla.core.xla_model as xm  # NKI kernels take tensors on the Neuron (XLA) device

    dev = xm.xla_device()
    q, k, v = _qkv(lo * 41 + hi, sq=256, sk=256, d=128, dtype=torch.bfloat16)
    got = bounded_attention_nki(*(t.to(dev) for t in (q, k, v, torch.tensor(lo), torch.tensor(hi))),
                                return_stats=True)
    got = tuple(t.cpu() for t in got)
    want = bounded_attention(q, k, v, torch.tensor(lo), torch.tensor(hi), return_stats=True)
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=2e-2, rtol=2e-2)  # bf16 inputs
    torch.testing.assert_close(got[1], want[1], atol=2e-2, rtol=2e-2)  # lse
