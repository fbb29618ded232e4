"""The backend as an object: declarations (passes/backend_facts.py) with their behaviour
(codegen/backends.py), and generic code that asks capabilities instead of comparing names.

Oracles: the error texts codegen gave when it compared names (pinned here word for word), the
compile-worker count $DIFFLET_COMPILE_WORKERS asks for, and the source text itself (no name
comparison outside the backend modules). Nothing is compiled and no SDK is needed.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from difflet.codegen.backends import BEHAVIOUR, get_backend
from difflet.errors import DiffletError
from difflet.frontend.lower import lower_file
from difflet.passes import built
from difflet.passes.backend_facts import BACKENDS, backend_facts
from difflet.passes.pipeline import optimize

REPO = Path(__file__).resolve().parent.parent
FLUX = str(REPO / "models" / "flux-tiny.dsl")
# the backends' own modules (and the two tables that name them) may spell their names
BACKEND_FILES = {"codegen/backends.py", "passes/backend_facts.py", "codegen/inductor.py"}
NAME_TEST = re.compile(r"""[!=]=\s*["'](inductor|neuron)["']|["'](inductor|neuron)["']\s*[!=]=|"""
                       r"""\bin\s*[(\[{]\s*["'](inductor|neuron)["']""")


def test_every_declared_backend_has_its_behaviour():
    assert set(BEHAVIOUR) == set(BACKENDS)
    for name, facts in BACKENDS.items():
        parts = BEHAVIOUR[name]()
        module = parts["module"]
        for attr in ("compile_entry", "program_weights", "PROGRAM_FILE"):
            assert hasattr(module, attr), f"{name}: {module.__name__} lacks {attr}"
        assert parts.get("runner") is not None or hasattr(module, "CompiledRunner"), f"{name}: no loader"
        assert (parts.get("spmd_program") is not None) == facts.spmd_splits, name


def test_no_backend_name_is_compared_outside_the_backend_modules():
    found = []
    for path in sorted((REPO / "difflet").rglob("*.py")):
        rel = path.relative_to(REPO / "difflet").as_posix()
        if rel in BACKEND_FILES or re.fullmatch(r"codegen/neuron[a-z_]*\.py", rel):
            continue
        found += [f"{rel}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1) if NAME_TEST.search(line)]
    assert found == []


def test_the_name_test_sees_the_comparisons_it_forbids():
    assert all(NAME_TEST.search(s) for s in ('if backend == "neuron":', "'inductor' != be", 'x in ("inductor", y)'))
    assert not NAME_TEST.search('codegen(module, backend="inductor")')


def test_an_unknown_backend_is_named_with_the_known_ones():
    with pytest.raises(DiffletError, match=r"unknown backend 'tpu' \(choose one of: inductor, neuron\)") as err:
        get_backend("tpu")
    assert err.value.where == "--backend"


def test_only_a_flagged_backend_adds_a_key_part():
    from difflet.passes.neuron_flags import compiler_args
    from difflet.passes.targets import load_target

    assert BACKENDS["inductor"].key_part("cpu") == {} and BACKENDS["neuron"].key_part(None) == {}
    assert BACKENDS["neuron"].key_part("trn2") == {"neuron_compiler_args": compiler_args(load_target("trn2"))}


def test_split_refusals_name_the_backends_that_build_them():
    planned = optimize(lower_file(FLUX), "tp2", target="cpu")
    assert built.layout_reason(planned.component("transformer"), "tpu") == (
        "split programs are built for the inductor, neuron backends only so far, not tpu")


def test_shape_buckets_are_refused_for_a_backend_without_them():
    from difflet.codegen.driver import _check_buckets

    sized = lower_file(FLUX, shapes=["32x32", "48x32"])
    _check_buckets(sized, backend_facts("inductor"))
    with pytest.raises(DiffletError, match=r"^--backend: shape buckets are built for the inductor backend only "
                                           r"so far, not 'neuron'$"):
        _check_buckets(sized, backend_facts("neuron"))


def test_an_spmd_program_takes_no_rank_worker_options():
    from difflet.codegen.split_codegen import split_program

    planned = optimize(lower_file(FLUX), "tp2", target="trn2", backend="neuron")
    with pytest.raises(DiffletError, match=r"'transformer': a neuron SPMD program takes no rank-worker options "
                                           r"\(timeout\); cfg layouts are not built for neuron"):
        split_program(planned.component("transformer"), "neuron", [], [], timeout=1.0)


@pytest.mark.parametrize("backend, workers", [("inductor", 2), ("neuron", 1)])
def test_only_a_parallel_compiles_backend_compiles_in_workers(monkeypatch, tmp_path, backend, workers):
    from difflet.codegen.compile_pool import WORKERS_ENV, CompilePool

    monkeypatch.setenv(WORKERS_ENV, "2")
    planned = optimize(lower_file(FLUX), "tp1", target="cpu")
    missing = list(planned.components())[:2]
    pool = CompilePool(planned, missing, tmp_path, tmp_path, backend, tmp_path, verbose=False)
    assert pool.workers == workers and len(pool.nodes) == (2 if workers > 1 else 0)
