"""CfgProgram's protocol with toy runners (no model), on qwen-image-tiny's tp1+cfg2 denoiser node: group
0 gets the conditional inputs, group 1 the same inputs with the `uncond_*` twins in their place, both
run at once, outputs come back as (cond..., uncond...); a worker that dies in either group surfaces as
RankError naming its global rank, and close() stops both groups."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from difflet.parallel.launch import RankError

QWEN_TINY = Path(__file__).resolve().parent.parent / "models" / "qwen-image-tiny.dsl"
MEET_S = 120  # how long a pass waits for the other group's pass to be running too


def _node():
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    return optimize(lower_file(str(QWEN_TINY)), parallel="tp1+cfg2", target="cpu").component("transformer")


def text_sum_loader(rank, groups, group, die, meet):
    """Runner: (sum of encoder_hidden_states + 1000 x valid_text, as the sample's shape), returned
    only once both groups' passes are inside their call (a file each in `meet`); a pass that waited
    MEET_S in vain returns NaN (the groups ran one after the other). Group `die` kills its worker."""
    def run(hidden, text, timestep, valid):
        if group == die:
            os.kill(os.getpid(), signal.SIGKILL)
        if meet is None:  # no meeting asked for: answer at once
            return (torch.full_like(hidden, float(text.double().sum() + 1000 * valid)),)
        calls = len(list(Path(meet).glob(f"group{group}.*")))
        (Path(meet) / f"group{group}.{calls}").touch()
        deadline = time.monotonic() + MEET_S
        while not (Path(meet) / f"group{1 - group}.{calls}").exists():
            if time.monotonic() > deadline:
                return (torch.full_like(hidden, float("nan")),)
            time.sleep(0.01)
        return (torch.full_like(hidden, float(text.double().sum() + 1000 * valid)),)
    return run


def _program(node, die=-1, meet=None):
    from difflet.parallel.cfg_program import CfgProgram
    from difflet.parallel.workers import SplitProgram
    from difflet.passes.cfg_branch import cond_view

    inner = cond_view(node)
    degrees = {"dp": 1, "cfg": 1, "cp": 1, "tp": 1}
    return CfgProgram(node, inner, lambda g: SplitProgram(inner, degrees, text_sum_loader, [(g, die, meet and str(meet))],
                                                          timeout=120, first_rank=g))


def _call(node):
    from difflet.codegen.build import example_inputs

    x = list(example_inputs(node))  # hidden, text, timestep, valid_text, uncond text, uncond valid_text
    x[4] = torch.randn(x[4].shape, dtype=x[4].dtype)
    x[3], x[5] = torch.tensor(5), torch.tensor(2)
    return x


def test_groups_get_their_pass_and_run_at_once(tmp_path):
    node = _node()
    x = _call(node)
    with _program(node, meet=tmp_path) as prog:
        for _ in range(2):  # each pass returns only once the other group's pass runs too
            cond, uncond = prog(*x)
            assert float(cond.flatten()[0]) == pytest.approx(float(x[1].double().sum() + 5000))
            assert float(uncond.flatten()[0]) == pytest.approx(float(x[4].double().sum() + 2000))
    with pytest.raises(RankError, match="unusable"):
        prog(*x)
    assert all(not p._procs for p in prog.groups)  # close() stopped both groups


@pytest.mark.parametrize("die", [0, 1])
def test_a_dead_worker_in_either_group_is_named_and_breaks_the_program(die):
    node = _node()
    prog = _program(node, die)
    try:
        with pytest.raises(RankError, match=rf"rank worker {die} died \(signal 9\)"):
            prog(*_call(node))
        with pytest.raises(RankError, match="unusable"):
            prog(*_call(node))
    finally:
        prog.close()
    assert all(not p._procs for p in prog.groups)
