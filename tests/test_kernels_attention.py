"""bounded_attention: the torch reference and the fused implementation against a dense-mask SDPA
oracle, the (out, lse) stats, partial merging, and one AOTInductor program for every bound."""
import math

import pytest
import torch
import torch.nn.functional as F

from difflet.kernels.attention_fused import bounded_attention as fused
from difflet.kernels.attention_ref import bounded_attention, merge_partials

# (lo, hi) over Sk = 11: full range, one key, interior, last key, prefix, empty.
BOUNDS = [(0, 11), (0, 1), (3, 9), (10, 11), (0, 6), (4, 4)]


def _qkv(seed, b=2, h=3, sq=7, sk=11, d=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, s, d, generator=g).to(dtype) for s in (sq, sk, sk))


def _oracle(q, k, v, lo, hi):
    """Dense [Sq, Sk] boolean mask in float64; an empty interval is all zeros by contract."""
    if hi <= lo:
        return torch.zeros_like(q)
    mask = torch.zeros(q.shape[-2], k.shape[-2], dtype=torch.bool)
    mask[:, lo:hi] = True
    out = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    return out.to(q.dtype)


def _lse_oracle(q, k, lo, hi):
    s = (q.double() @ k.double().transpose(-1, -2))[..., lo:hi] / math.sqrt(q.shape[-1])
    return torch.logsumexp(s, -1).float()


@pytest.mark.parametrize("impl", [bounded_attention, fused], ids=["ref", "fused"])
@pytest.mark.parametrize("lo,hi", BOUNDS)
def test_matches_dense_mask_sdpa(impl, lo, hi):
    q, k, v = _qkv(lo * 17 + hi)
    out = impl(q, k, v, torch.tensor(lo), torch.tensor(hi))
    assert not out.isnan().any()
    assert (out - _oracle(q, k, v, lo, hi)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("lo,hi", BOUNDS)
def test_fused_bf16_within_bf16_rounding(lo, hi):
    q, k, v = _qkv(lo * 5 + hi, dtype=torch.bfloat16)
    out = fused(q, k, v, torch.tensor(lo), torch.tensor(hi))
    want = _oracle(q.float(), k.float(), v.float(), lo, hi)  # exact maths on the bf16 inputs
    # bf16 has an 8-bit mantissa: one rounding of the output is 2^-8 of its magnitude; allow 2 ulps.
    tol = 2 * 2.0 ** -8 * max(want.abs().max().item(), 1e-3)
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    assert (out.float() - want).abs().max().item() <= tol


@pytest.mark.parametrize("impl", [bounded_attention, fused], ids=["ref", "fused"])
@pytest.mark.parametrize("lo,hi", [(2, 9), (0, 11), (10, 11)])
def test_stats_are_log_sum_exp(impl, lo, hi):
    q, k, v = _qkv(1)
    out, lse = impl(q, k, v, torch.tensor(lo), torch.tensor(hi), return_stats=True)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:-1]
    assert (lse - _lse_oracle(q, k, lo, hi)).abs().max().item() <= 1e-5
    assert (out - _oracle(q, k, v, lo, hi)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("impl", [bounded_attention, fused], ids=["ref", "fused"])
def test_empty_interval_is_zero_and_minus_inf_not_nan(impl):
    q, k, v = _qkv(3)
    out, lse = impl(q, k, v, torch.tensor(4), torch.tensor(4), return_stats=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()  # no keys: 0 exactly


@pytest.mark.parametrize("impl", [bounded_attention, fused], ids=["ref", "fused"])
def test_partials_over_disjoint_intervals_merge_to_the_whole(impl):
    """Includes an empty partial: it must contribute nothing (weight exp(-inf) = 0), not NaN."""
    q, k, v = _qkv(2)
    parts = [impl(q, k, v, torch.tensor(a), torch.tensor(b), return_stats=True)
             for a, b in [(0, 4), (4, 4), (4, 5), (5, 11)]]
    out, lse = merge_partials(parts)
    assert (out - _oracle(q, k, v, 0, 11)).abs().max().item() <= 1e-5
    assert (lse - _lse_oracle(q, k, 0, 11)).abs().max().item() <= 1e-5
    # Folding one at a time (a ring) is the same as merging all at once.
    run = parts[0]
    for p in parts[1:]:
        run = merge_partials([run, p])
    assert (run[0] - out).abs().max().item() <= 1e-6


def test_merge_of_only_empty_partials_is_zero():
    q, k, v = _qkv(6)
    parts = [fused(q, k, v, torch.tensor(3), torch.tensor(3), return_stats=True)] * 2
    out, lse = merge_partials(parts)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


class _Attn(torch.nn.Module):
    def __init__(self, return_stats):
        super().__init__()
        self.return_stats = return_stats

    def forward(self, q, k, v, lo, hi):
        return fused(q, k, v, lo, hi, return_stats=self.return_stats)


@pytest.mark.slow  # two AOTInductor compiles (about 45 s): not in the quick tier
@pytest.mark.parametrize("return_stats", [False, True], ids=["out", "stats"])
def test_one_aot_inductor_program_serves_every_bound(tmp_path, return_stats):
    """Exported and compiled once (as codegen does) at one bound, run at every bound."""
    from torch._inductor.package import load_package

    from difflet.codegen.inductor import aoti_package

    q, k, v = _qkv(4)
    ep = torch.export.export(_Attn(return_stats), (q, k, v, torch.tensor(0), torch.tensor(11)), strict=False)
    aoti_package(ep, tmp_path / "attn.pt2")
    prog = load_package(str(tmp_path / "attn.pt2"))
    for lo, hi in BOUNDS:
        got = prog(q, k, v, torch.tensor(lo), torch.tensor(hi))
        out = got[0] if return_stats else got
        assert not out.isnan().any()
        assert (out - _oracle(q, k, v, lo, hi)).abs().max().item() <= 1e-5, (lo, hi)
        if return_stats:
            want = _lse_oracle(q, k, lo, hi)
            if hi <= lo:
                assert torch.isneginf(got[1]).all()
            else:
                assert (got[1] - want).abs().max().item() <= 1e-5, (lo, hi)


def test_fused_program_never_builds_the_score_matrix():
    """The exported graph's only [*, Sq, Sk]-sized op would be scores; the fused one has none."""
    q, k, v = _qkv(5, sq=13, sk=17)
    ep = torch.export.export(_Attn(False), (q, k, v, torch.tensor(0), torch.tensor(17)), strict=False)
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        shape = tuple(val.shape) if isinstance(val, torch.Tensor) else ()
        assert not (len(shape) >= 2 and shape[-2:] == (13, 17)), (node.format_node(), shape)


def test_top_level_kernels_name_is_not_difflets(tmp_path):
    """The attention kernels live in difflet.kernels: a top-level `import kernels` (Hugging Face's
    package, which diffusers probes for) must never resolve to Difflet's code."""
    import subprocess
    import sys

    code = ("import importlib.util, pathlib\n"
            "spec = importlib.util.find_spec('kernels')\n"
            "origin = spec and (spec.origin or str(list(spec.submodule_search_locations)))\n"
            "print(origin or 'absent')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True,
                         capture_output=True, text=True).stdout.strip()
    repo = str(__import__("pathlib").Path(__file__).resolve().parent.parent)
    assert out == "absent" or not out.startswith(repo), out
