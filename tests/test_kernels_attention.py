"""bounded_attention vs a dense-mask SDPA oracle, its stats, partial merging, and export."""
import math

import pytest
import torch
import torch.nn.functional as F

from difflet.kernels.attention_ref import bounded_attention, merge_partials


def _qkv(seed, b=2, h=3, sq=7, sk=11, d=8):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, sq, d, generator=g), torch.randn(b, h, sk, d, generator=g),
            torch.randn(b, h, sk, d, generator=g))


def _oracle(q, k, v, lo, hi):
    mask = torch.zeros(1, k.shape[-2], dtype=torch.bool)
    mask[:, lo:hi] = True
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("lo,hi", [(0, 11), (0, 1), (3, 9), (10, 11), (0, 6)])
def test_matches_dense_mask_sdpa(lo, hi):
    q, k, v = _qkv(lo * 17 + hi)
    out = bounded_attention(q, k, v, torch.tensor(lo), torch.tensor(hi))
    torch.testing.assert_close(out, _oracle(q, k, v, lo, hi), atol=1e-5, rtol=1e-5)


def test_stats_are_max_sum_and_unnormalized_sum():
    q, k, v = _qkv(1)
    lo, hi = 2, 9
    out, acc, m, l = bounded_attention(q, k, v, torch.tensor(lo), torch.tensor(hi), return_stats=True)
    s = (q @ k.transpose(-1, -2))[..., lo:hi] / math.sqrt(q.shape[-1])
    torch.testing.assert_close(m, s.amax(-1))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    torch.testing.assert_close(l, p.sum(-1))
    torch.testing.assert_close(acc, p @ v[..., lo:hi, :], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, _oracle(q, k, v, lo, hi), atol=1e-5, rtol=1e-5)


def test_partials_over_disjoint_intervals_merge_to_the_whole():
    q, k, v = _qkv(2)
    parts = [bounded_attention(q, k, v, torch.tensor(a), torch.tensor(b), return_stats=True)[1:]
             for a, b in [(0, 4), (4, 5), (5, 11)]]
    torch.testing.assert_close(merge_partials(parts), _oracle(q, k, v, 0, 11), atol=1e-5, rtol=1e-5)


def test_empty_interval_is_zero_not_nan():
    q, k, v = _qkv(3)
    out, acc, m, l = bounded_attention(q, k, v, torch.tensor(4), torch.tensor(4), return_stats=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(l, torch.zeros_like(l))  # no keys: 0 exactly
    assert torch.isneginf(m).all()


def test_one_exported_program_serves_every_bound():
    class Attn(torch.nn.Module):
        def forward(self, q, k, v, hi):
            return bounded_attention(q, k, v, torch.zeros((), dtype=torch.int64), hi)

    q, k, v = _qkv(4)
    ep = torch.export.export(Attn(), (q, k, v, torch.tensor(11)), strict=False)
    for hi in (1, 5, 11):
        torch.testing.assert_close(ep.module()(q, k, v, torch.tensor(hi)), _oracle(q, k, v, 0, hi),
                                   atol=1e-5, rtol=1e-5)


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
