"""TP column/row linears and SP regions on 4 real gloo ranks (tp2 x cfg2 groups) equal
the unsplit computation. One launch (module fixture); every rank returns what it computed."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from difflet.parallel.launch import run_ranks

B, S, DIN, DH, DOUT = 2, 8, 12, 16, 10  # S and DH divide by tp=2


def _weights():
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(x=r(B, S, DIN), w1=r(DH, DIN), b1=r(DH), w2=r(DOUT, DH), b2=r(DOUT))


def _unsplit_mlp(x, w):
    return F.linear(F.gelu(F.linear(x, w["w1"], w["b1"])), w["w2"], w["b2"])


def _rank_body(rank: int, world: int):
    from difflet.parallel.groups import make_groups
    from difflet.parallel.linears import (column_parallel_linear, row_parallel_linear, shard_linear, sp_enter,
                                          sp_scatter)

    groups = make_groups({"tp": 2, "cfg": 2})
    tp, i = groups.group("tp"), groups.index("tp")
    w = _weights()
    w1, b1 = shard_linear(w["w1"], w["b1"], "column", i, 2)
    w2, b2 = shard_linear(w["w2"], w["b2"], "row", i, 2)
    out = {"coords": groups.coords, "ranks": groups.ranks}
    # TP: replicated tokens in, all-reduce after the row linear, replicated out.
    out["tp"] = row_parallel_linear(F.gelu(column_parallel_linear(w["x"], w1, b1)), w2, b2, tp)
    # TP+SP: token shard in, all-gather before, reduce-scatter after, token shard out.
    x_local = sp_scatter(w["x"], tp)
    h = column_parallel_linear(sp_enter(x_local, tp), w1, b1)
    out["sp"] = row_parallel_linear(F.gelu(h), w2, b2, tp, sp=True)
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(_rank_body, 4)


def test_groups_on_ranks(ranks):
    for r, res in enumerate(ranks):
        assert res["coords"] == {"tp": r % 2, "cp": 0, "cfg": r // 2, "dp": 0}
        assert res["ranks"]["tp"] == ((0, 1) if r < 2 else (2, 3))
        assert res["ranks"]["cfg"] == (r % 2, r % 2 + 2)


def test_tp_linears_equal_unsplit(ranks):
    w = _weights()
    ref = _unsplit_mlp(w["x"], w)
    for res in ranks:
        assert (res["tp"] - ref).abs().max().item() <= 1e-5


def test_sp_region_gives_token_shard_of_unsplit(ranks):
    w = _weights()
    ref = _unsplit_mlp(w["x"], w)
    for r, res in enumerate(ranks):
        shard = ref[:, (r % 2) * S // 2:(r % 2 + 1) * S // 2]
        assert res["sp"].shape == shard.shape
        assert (res["sp"] - shard).abs().max().item() <= 1e-5


def test_shard_errors():
    from difflet.parallel.linears import shard, shard_linear

    with pytest.raises(ValueError):
        shard(torch.zeros(3, 4), 0, 0, 2)
    with pytest.raises(ValueError):
        shard_linear(torch.zeros(4, 4), None, "diagonal", 0, 2)
