"""The oracle of the parallel tests, checked: unsplit bounded attention equals diffusers-style dense
SDPA with an explicit boolean mask over the model's own [text, visual] order; and the pure rank
group arithmetic agrees with the planner's ParallelConfig. Single process, no collectives."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from difflet.parallel.groups import AXES, axis_groups, coords, degrees_of
from difflet.kernels.attention_ref import bounded_attention


@pytest.mark.parametrize("valid", [1, 3, 6, 8])
def test_bounded_equals_masked_sdpa(valid):
    g = torch.Generator().manual_seed(1)
    B, H, V, T, D = 2, 3, 12, 8, 16
    q, k, v = (torch.randn(B, H, T + V, D, generator=g) for _ in range(3))  # model order [text, visual]
    # Dense oracle: FLUX-style joint sequence, padded text keys (valid..T) masked out explicitly.
    keep = torch.ones(T + V, dtype=torch.bool)
    keep[valid:T] = False
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=keep.expand(T + V, T + V))
    # Bounded: keys rearranged [visual, text] so the valid ones are the interval [0, V + valid).
    kb = torch.cat([k[:, :, T:], k[:, :, :T]], 2)
    vb = torch.cat([v[:, :, T:], v[:, :, :T]], 2)
    out = bounded_attention(q, kb, vb, torch.tensor(0), torch.tensor(V + valid))
    assert (out - dense).abs().max().item() <= 1e-5


def test_stats_merge_over_disjoint_keys_equals_whole():
    """return_stats (out, lse) partials over a key split, merged, equal the unsplit output."""
    from difflet.kernels.attention_ref import merge_partials

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 10, 8, generator=g) for _ in range(3))
    whole = bounded_attention(q, k, v, torch.tensor(0), torch.tensor(7))
    a = bounded_attention(q, k[:, :, :4], v[:, :, :4], torch.tensor(0), torch.tensor(4), return_stats=True)
    b = bounded_attention(q, k[:, :, 4:], v[:, :, 4:], torch.tensor(0), torch.tensor(3), return_stats=True)
    out, _ = merge_partials([a, b])
    assert (out - whole).abs().max().item() <= 1e-6


@pytest.mark.parametrize("spec", [dict(tp=4), dict(tp=2, cp=2), dict(dp=2, tp=2), dict(tp=2, cfg=2),
                                  dict(dp=2, cfg=2, cp=2, tp=2), dict(cp=3, tp=2)])
def test_groups_match_parallel_config(spec):
    from difflet.passes.parallel_config import ParallelConfig

    pc = ParallelConfig(**spec)
    deg = degrees_of(pc)
    for axis in AXES:
        assert axis_groups(deg, axis) == pc.groups(axis), axis
        assert sorted(r for grp in axis_groups(deg, axis) for r in grp) == list(range(pc.world))
    for r in range(pc.world):
        assert coords(r, deg) == pc.coords(r)
        assert pc.rank(**coords(r, deg)) == r


def test_tp_is_innermost():
    deg = degrees_of(dict(tp=2, cp=2))
    assert axis_groups(deg, "tp") == ((0, 1), (2, 3))
    assert axis_groups(deg, "cp") == ((0, 2), (1, 3))
    with pytest.raises(ValueError):
        degrees_of(dict(tp=0))
