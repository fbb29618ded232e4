"""`--list-legal` calls legal only what codegen builds: difflet/passes/built.py is the single
source of both verdicts, checked here against the family declarations and codegen's refusals without compiling
(the split and probe tests compile one program per rule path: FLUX TP/SP and Ulysses/Ring/
gather_kv in tests/test_split_flux.py and test_split_compiled.py, Qwen-Image TP in
test_split_qwen.py, Wan 2.1 TP+SP+CP ring in test_split_wan.py, LTX-2 CP ring in
test_split_ltx2.py, the FLUX probe in
test_stepcache_probe.py, the other families' probes in test_stepcache_families.py).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from difflet.codegen.driver import _require_planned
from difflet.codegen.declarations import declared
from difflet.families import FAMILIES, programs
from difflet.codegen.probe import probe_node
from difflet.errors import DiffletError
from difflet.frontend.lower import lower_file
from difflet.passes import built, legal_configs
from difflet.passes.parallel_config import parse_parallel
from difflet.passes.pipeline import Options, optimize
from difflet.passes.targets import load_target

REPO = Path(__file__).resolve().parent.parent
TINY = sorted(p for p in (REPO / "models").glob("*.dsl") if "tiny" in p.stem)


def test_family_declarations_say_how_for_exactly_what_built_lists():
    assert set(declared("split")) == set(built.split_built())
    assert set(declared("probe")) == set(built.probe_built())
    assert set(declared("blocks")) == set(built.blocks_built())


def test_every_class_is_declared_by_one_family():
    owners: dict[str, list[str]] = {}
    for family in FAMILIES:
        for cls in getattr(programs(family), "CLASSES", {}):
            owners.setdefault(cls, []).append(family)
    assert {c: f for c, f in owners.items() if len(f) > 1} == {}


@pytest.mark.parametrize("dsl", TINY, ids=lambda p: p.stem)
@pytest.mark.parametrize("probe", ["none", "separate"])
def test_every_legal_row_is_accepted_by_codegen_and_no_other(dsl, probe):
    module = lower_file(str(dsl))
    opts = Options(parallel=parse_parallel("tp1"), target="cpu", backend=load_target("cpu")["backends"][0],
                   probe=probe)
    rows = [r for r in legal_configs.rows(module, opts, 4) if r.legal]
    assert rows, "the planner accepts some 4-core layout of every tiny model"
    for row in rows:
        label, cfg = row.config.label(), row.config
        planned = optimize(module, parallel=cfg.name(), attention=cfg.attention if cfg.cp > 1 else None,
                           target="cpu", probe=probe)
        if row.buildable:
            _require_planned(planned)
            if probe == "separate":
                assert probe_node(planned) is not None
            continue
        comp, reason = row.unbuilt[0]
        with pytest.raises(DiffletError) as err:
            _require_planned(planned)
            probe_node(planned)
        assert reason in err.value.message, (label, comp)
