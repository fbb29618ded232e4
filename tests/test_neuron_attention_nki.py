"""The NKI bounded-attention adapter (difflet/kernels/attention_nki.py) against the contract.

The kernel is replaced on CPU by tests/nki_attention_double.py, which encodes nki-library tag
2.29's src/nkilib_src/nkilib/core/attention/attention_cte.py (signature, asserts, the finite
_FLOAT32_MIN fill) and its torch reference attention_cte_torch.py (`attention_cte_torch_ref`:
layouts per tp_q/tp_k/tp_out, int32 (seqlen_q, 1) bounds, -inf fill, cache_softmax's
neg_max = -max and recip = 1/sum in [bs, 128, Sq/128]). The oracle is Difflet's contract
reference attention_ref.bounded_attention (checked against dense SDPA in test_kernels_attention.py).
Tolerances: fp32 1e-5 (same float32 sums, different order; a wrong layout, scale or statistic is
off by ~1e-1); bf16 2e-2 (the adapter pre-scales q in bf16 and the output is bf16).
The cases marked `on_trn2` run the real attention_cte[2] and skip elsewhere.
"""
from __future__ import annotations

import importlib.util
import inspect
import math

import pytest
import torch

from difflet.kernels import attention_nki
from difflet.kernels.attention_nki import TILE, bounded_attention_nki, kernel_stats
from difflet.kernels.attention_ref import bounded_attention, merge_partials
from nki_attention_double import FLOAT32_MIN, AttentionCteDouble

HAS_NKI = importlib.util.find_spec("nkilib") is not None and importlib.util.find_spec("neuronxcc") is not None
on_trn2 = pytest.mark.skipif(not HAS_NKI, reason="needs a trn2 host with the Neuron SDK 2.29 "
                             "(nkilib + neuronx-cc); PyPI carries only placeholders")
FILLS = [float("-inf"), FLOAT32_MIN]  # attention_cte_torch.py's mask fill, attention_cte.py's
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _qkv(seed, b=1, h=3, sq=40, sk=40, d=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=g).to(dtype) for n in (sq, sk, sk))


# full, one key (first / last), partial, empty, hi beyond the keys
CASES = [(0, 40), (0, 1), (39, 40), (5, 33), (0, 24), (9, 9), (30, 64)]


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lo,hi", CASES)
def test_adapter_matches_the_contract_with_stats(lo, hi, dtype, fill):
    q, k, v = _qkv(lo * 41 + hi, dtype=dtype)
    kern = AttentionCteDouble(fill)
    got = bounded_attention_nki(q, k, v, torch.tensor(lo), torch.tensor(hi), return_stats=True, kernel=kern)
    want = bounded_attention(q, k, v, torch.tensor(lo), torch.tensor(hi), return_stats=True)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g.float(), w.float(), atol=TOL[dtype], rtol=TOL[dtype])
    (call,) = kern.calls
    assert call["bound_min"] is not None and call["cache_softmax"] and call["scale"] == 1.0
    assert call["q"] == call["k"] == (3, TILE, 16)  # masked: equal padded Q/K lengths, k as [BH, S, d]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lo,hi", [(0, 40), (3, 17), (9, 9)])
def test_adapter_without_stats(lo, hi, dtype):
    q, k, v = _qkv(lo + 7 * hi, dtype=dtype)
    got = bounded_attention_nki(q, k, v, torch.tensor(lo), torch.tensor(hi), kernel=AttentionCteDouble())
    want = bounded_attention(q, k, v, torch.tensor(lo), torch.tensor(hi))
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("stats", [False, True])
def test_whole_runs_unbounded_as_nxd_inference_flux(stats):
    """whole=True: NxD Inference FLUX's call (modeling_flux.py): scale positional, no bounds."""
    q, k, v = _qkv(5, sq=40, sk=57)
    kern = AttentionCteDouble()
    got = bounded_attention_nki(q, k, v, torch.tensor(0), torch.tensor(57), return_stats=stats, whole=True,
                                kernel=kern)
    want = bounded_attention(q, k, v, torch.tensor(0), torch.tensor(57), return_stats=stats)
    for g, w in zip(got if stats else [got], want if stats else [want], strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    (call,) = kern.calls
    assert call["bound_min"] is None and call["scale"] == pytest.approx(1 / math.sqrt(16))
    assert (call["tp_q"], call["tp_k"], call["tp_out"], call["causal_mask"]) == (True, True, False, False)
    assert call["q"] == ((3, TILE, 16) if stats else (3, 40, 16)) and call["k"] == (3, 57, 16)


def test_unequal_lengths_and_padding_rows():
    q, k, v = _qkv(7, sq=130, sk=57)  # padded to 256 rows for q and k/v; keys fewer than queries
    kern = AttentionCteDouble(FLOAT32_MIN)
    got = bounded_attention_nki(q, k, v, torch.tensor(3), torch.tensor(50), kernel=kern)
    torch.testing.assert_close(got, bounded_attention(q, k, v, torch.tensor(3), torch.tensor(50)),
                               atol=1e-5, rtol=1e-5)
    assert kern.calls[0]["q"] == kern.calls[0]["k"] == (3, 256, 16)


def test_partials_merge_exactly_for_ring():
    q, k, v = _qkv(2)
    parts = [bounded_attention_nki(q, k, v, torch.tensor(a), torch.tensor(b), return_stats=True,
                                   kernel=AttentionCteDouble(FLOAT32_MIN)) for a, b in [(0, 13), (13, 13), (13, 40)]]
    whole = bounded_attention(q, k, v, torch.tensor(0), torch.tensor(40))
    torch.testing.assert_close(merge_partials(parts)[0], whole, atol=1e-5, rtol=1e-5)


def test_kernel_stats_reads_neg_max_and_recip_in_the_tile_major_layout():
    bh, sq = 2, 2 * TILE
    rows = torch.arange(bh * sq, dtype=torch.float32).reshape(bh, sq)  # row max = its own index
    tiles = lambda t: t.reshape(bh, 2, TILE).transpose(1, 2)  # noqa: E731  attention_cte_torch.py's reshape
    lse = kernel_stats(tiles(-rows), tiles(torch.full_like(rows, 0.5)), sq - 3)
    torch.testing.assert_close(lse, rows[:, :sq - 3] + math.log(2.0))  # max + log(1 / recip)


def test_the_double_refuses_what_2_29_does_not_take():
    """skip_output_normalization arrived in the 2.30 docs; 2.29's attention_cte has no such argument."""
    q, k, v = (t.reshape(3, 40, 16) for t in _qkv(1))
    with pytest.raises(TypeError, match="skip_output_normalization"):
        AttentionCteDouble()(q, k, v, skip_output_normalization=True)
    params = inspect.signature(AttentionCteDouble.__call__).parameters
    assert "skip_output_normalization" not in params and list(params)[-2:] == ["bound_min", "bound_max"]


def test_the_adapter_imports_the_kernel_from_its_submodule(monkeypatch):
    """nki-library 2.29's nkilib/core/attention/__init__.py is the license only: the kernel is
    `nkilib.core.attention.attention_cte.attention_cte` (NxD Inference's import), indexed [2]."""
    import sys
    import types

    seen = []

    class Jit:
        def __getitem__(self, grid):
            seen.append(grid)
            return "kernel[2]"

    pkg = {n: types.ModuleType(n) for n in ("nkilib", "nkilib.core", "nkilib.core.attention",
                                            "nkilib.core.attention.attention_cte")}
    pkg["nkilib.core.attention.attention_cte"].attention_cte = Jit()
    for name, mod in pkg.items():
        monkeypatch.setitem(sys.modules, name, mod)
    assert attention_nki.nki_kernel() == "kernel[2]" and seen == [2]


@on_trn2
@pytest.mark.parametrize("lo,hi", [(0, 256), (0, 1), (5, 200), (9, 9)])
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
