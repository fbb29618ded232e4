"""Parallel-config parsing and rank groups against tests/golden/passes/parallel_configs.txt."""
from pathlib import Path

import pytest

from difflet.errors import DiffletError
from difflet.passes.parallel_config import enumerate_configs, parse_parallel

GOLDEN = Path(__file__).parent / "golden" / "passes" / "parallel_configs.txt"


def _cases():
    valid, invalid = GOLDEN.read_text().split("# -----\n")
    rows = lambda text: [l for l in text.splitlines() if l.strip() and not l.startswith("#")]
    return rows(valid), rows(invalid)


def _split(line):
    lhs, want = line.split(" => ")
    text, att = (s.strip() for s in lhs.split("|"))
    return text, None if att == "-" else att, want


@pytest.mark.parametrize("line", _cases()[0])
def test_valid_configs(line):
    text, att, want = _split(line)
    pc = parse_parallel(text, att)
    groups = lambda axis: str([list(g) for g in pc.groups(axis)]).replace(" ", "")
    assert f"{pc.label()} ({pc.world}) tp={groups('tp')} cp={groups('cp')}" == want


@pytest.mark.parametrize("line", _cases()[1])
def test_invalid_configs(line):
    text, att, want = _split(line)
    with pytest.raises(DiffletError) as err:
        parse_parallel(text, att)
    assert want in str(err.value)


def test_rank_order_tp_innermost_then_cp_cfg_dp():
    pc = parse_parallel("dp2xtp2cp2+cfg2")
    assert pc.world == 16
    # rank = ((dp*cfg + cfg_i)*cp + cp_i)*tp + tp_i
    assert pc.coords(13) == {"tp": 1, "cp": 0, "cfg": 1, "dp": 1}
    assert pc.rank(dp=1, cfg=1, cp=0, tp=1) == 13
    assert pc.groups("dp")[0] == (0, 8)


def test_enumerate_four_cores_has_the_papers_configs():
    labels = {c.label() for c in enumerate_configs(4)}
    assert {"tp4", "tp4+sp", "tp2cp2 ulysses", "tp2cp2 ring", "tp2cp2 gather_kv", "tp2+cfg2",
            "dp2xtp2"} <= labels
    assert all(c.world == 4 for c in enumerate_configs(4))
