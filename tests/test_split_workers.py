"""SplitProgram's worker protocol on 2 gloo ranks, with toy runners (no model): full inputs reach every
rank, the ranks' collectives pair up, rank 0's outputs come back under Program's input checks, and a
failing rank surfaces as RankError naming it and leaves no usable program or live worker."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from difflet.errors import DiffletError
from difflet.parallel.launch import RankError

FLUX_TINY4 = Path(__file__).resolve().parent.parent / "models" / "flux-tiny4.dsl"


def _node():
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    return optimize(lower_file(str(FLUX_TINY4)), parallel="tp2", target="cpu").component("transformer")


def sum_loader(rank, groups):
    """Runner: (sum over the tp group of (rank + 1) * hidden_states,) -> 3 * x on 2 ranks."""
    from difflet.parallel import comm

    return lambda *t: (comm.all_reduce(t[0] * (rank + 1), groups.group("tp")),)


def bad_loader(rank, groups):
    if rank == 1:
        raise RuntimeError("no program for rank 1")
    return sum_loader(rank, groups)


def fail_on_call_loader(rank, groups):
    def run(*t):
        if rank == 1:
            raise RuntimeError("rank 1 failed mid-call")
        return sum_loader(rank, groups)(*t)
    return run


def _inputs(node):
    from difflet.codegen.build import example_inputs

    return example_inputs(node)


def _degrees(node):
    from difflet.codegen.split_codegen import degrees

    return degrees(node)


def test_every_rank_gets_the_inputs_and_rank0_returns_the_result():
    from difflet.parallel.workers import SplitProgram

    node = _node()
    x = _inputs(node)
    with SplitProgram(node, _degrees(node), sum_loader, [(), ()], timeout=300) as prog:
        for _ in range(2):  # resident: a second call reuses the same workers
            (out,) = prog(*x[:-1], 5)
            torch.testing.assert_close(out, 3 * x[0])
        with pytest.raises(DiffletError, match="valid_text"):
            prog(*x[:-1], 0)  # out of range: refused on the host, the workers stay usable
        assert torch.equal(prog(*x[:-1], 1)[0], 3 * x[0])  # x + 2x rounds once, like 3x: exact
    with pytest.raises(RankError, match="unusable"):
        prog(*x)


def test_a_rank_that_fails_to_load_is_named():
    from difflet.parallel.workers import SplitProgram

    node = _node()
    with pytest.raises(RankError, match="rank 1 failed while loading(.|\n)*no program for rank 1"):
        SplitProgram(node, _degrees(node), bad_loader, [(), ()], timeout=300)


def test_a_rank_that_fails_mid_call_breaks_the_program():
    from difflet.parallel.workers import SplitProgram

    node = _node()
    x = _inputs(node)
    prog = SplitProgram(node, _degrees(node), fail_on_call_loader, [(), ()], timeout=60)
    try:
        with pytest.raises(RankError, match="rank 1 failed mid-call"):
            prog(*x)
        with pytest.raises(RankError, match="unusable"):
            prog(*x)
    finally:
        prog.close()
    assert not prog._procs
