"""`difflet codegen --backend neuron` for split (tp) plans: the driver's dispatch to the NxD SPMD
path (difflet/codegen/neuron_spmd.py `emit_spmd`) and the legality that calls exactly that legal.

Oracles: the unsplit program module's own state dict (what the rank files must concatenate back
to) and the layout's Megatron shapes (column splits halve rows, row splits halve columns); the
planner's rows on target trn2 (difflet/passes/built.py is the one source of both verdicts).
There is no Neuron SDK here: the SDK calls (the single-core trace and NxD ModelBuilder) are
replaced by TEST DOUBLES defined in this file only, which write placeholder program files and
record their calls; nothing here claims a Neuron program was built. The module form the SPMD
trace would get is still RUN: tests/test_neuron_spmd_world.py's doubles of NxD's
Column/RowParallelLinear (parallel_layers/layers.py forward) on the ART's own rank files.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from difflet.codegen.driver import _require_planned
from difflet.errors import DiffletError
from difflet.frontend.lower import lower_file
from difflet.passes import built, legal_configs
from difflet.passes.parallel_config import parse_parallel
from difflet.passes.neuron_flags import role_args
from difflet.passes.pipeline import Options, optimize
from difflet.passes.targets import load_target

REPO = Path(__file__).resolve().parent.parent
SPLIT_TINY = ("flux-tiny", "wan2.1-tiny")  # an SPMD class, and a split class the SPMD path does not build
DOUBLE_TEXT = b"TEST DOUBLE: placeholder, not a Neuron program"


@pytest.mark.parametrize("name", SPLIT_TINY)
def test_trn2_legal_rows_are_exactly_what_neuron_codegen_accepts(name):
    module = lower_file(str(REPO / "models" / f"{name}.dsl"))
    opts = Options(parallel=parse_parallel("tp1"), target="trn2", backend="neuron")
    rows = [r for r in legal_configs.rows(module, opts, 4) if r.legal]
    verdicts = {}
    for row in rows:
        cfg = row.config
        planned = optimize(module, parallel=cfg.name(), attention=cfg.attention if cfg.cp > 1 else None,
                           target="trn2", backend="neuron")
        verdicts[cfg.label()] = row.buildable
        if row.buildable:
            _require_planned(planned, "neuron")
            continue
        with pytest.raises(DiffletError) as err:
            _require_planned(planned, "neuron")
        assert row.unbuilt[0][1] in err.value.message, cfg.label()
    denoiser = module.components("denoiser")[0].attrs["class"]
    # tp-only layouts of the SPMD classes are built; sp / cp layouts and other classes are not
    assert verdicts["dp2xtp2"] is (denoiser in built.spmd_built()), verdicts
    assert not any(v for label, v in verdicts.items() if "+sp" in label or "cp" in label), verdicts


# --- TEST DOUBLES of the Neuron SDK calls (defined here only; difflet never imports them) ---

class SpmdCompileDouble:
    """Stands in for neuron_spmd.compile_spmd (NxD ModelBuilder trace + compile + save): records
    the call and writes a placeholder file where the saved SPMD program would be."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, dict]] = []
        self.programs: list[torch.nn.Module] = []  # the unsplit program module compile_spmd gets
        self.args: list[list[str]] = []

    def __call__(self, node, pm, specs, tp, dest, compiler_args) -> None:
        import copy

        from difflet.codegen.neuron_spmd import PROGRAM_FILE

        self.calls.append((node.name, tp, dict(specs)))
        self.programs.append(copy.deepcopy(pm))
        self.args.append(list(compiler_args))
        (dest / PROGRAM_FILE).write_bytes(DOUBLE_TEXT)


def single_core_compile_double(node, pm, dest) -> None:
    """Stands in for neuron.compile_entry (torch_neuronx.trace) of the unsplit components."""
    from difflet.codegen.neuron import PROGRAM_FILE

    (dest / PROGRAM_FILE).write_bytes(DOUBLE_TEXT)


@pytest.fixture
def neuron_doubles(monkeypatch):
    from difflet.codegen import neuron, neuron_spmd

    spmd = SpmdCompileDouble()
    monkeypatch.setattr(neuron, "require_sdk", lambda: None)  # the double pretends the SDK is present
    monkeypatch.setattr(neuron, "compile_entry", single_core_compile_double)
    monkeypatch.setattr(neuron_spmd, "compile_spmd", spmd)
    from difflet.kernels import attention_nki
    from nki_attention_double import AttentionCteDouble  # neuron programs call NKI attention_cte (2.29)

    monkeypatch.setattr(attention_nki, "nki_kernel", AttentionCteDouble)
    monkeypatch.setenv("DIFFLET_COMPILE_WORKERS", "1")  # spawned workers would not see the doubles
    return spmd


def _expected_shapes(state: dict, specs: dict, tp: int) -> dict:
    """Each rank's tensor shapes by NxD's layers.py set_weight_and_bias_config: column weight
    rows / tp, row weight cols / tp; bias `output_size if gather_output else
    output_size_per_partition` for a column layer (column_gather keeps it whole), whole for row."""
    from difflet.codegen.neuron_spmd import PREFIX

    want = {k: tuple(v.shape) for k, v in state.items()}
    for path, (style, _) in specs.items():
        w = f"{PREFIX}{path}.weight"
        rows, cols = want[w]
        want[w] = (rows, cols // tp) if style == "row" else (rows // tp, cols)
        if style == "column" and f"{PREFIX}{path}.bias" in want:
            want[f"{PREFIX}{path}.bias"] = (rows // tp,)
    return want


def test_codegen_sends_a_tp2_plan_to_one_spmd_program_with_presharded_rank_files(tmp_path, neuron_doubles):
    from oracle_util import random_checkpoint
    from safetensors.torch import load_file

    from difflet.codegen.build import build_program_module
    from difflet.codegen.driver import codegen
    from difflet.codegen.neuron_spmd import RANK_KEY, unshard

    planned = optimize(lower_file(str(REPO / "models" / "flux-tiny.dsl")), "tp2", target="trn2", backend="neuron")
    ckpt = random_checkpoint(planned)
    store, out = tmp_path / "store", tmp_path / "art"
    result = codegen(planned, str(ckpt), out, backend="neuron", store=store, log=lambda *_: None)

    assert [(name, tp) for name, tp, _ in neuron_doubles.calls] == [("transformer", 2)]  # one trace, all ranks
    specs = neuron_doubles.calls[0][2]
    entry = result.manifest.components["transformer"]
    assert entry.world == 2 and len(entry.ranks) == 2
    programs = [out / f.program.path for f in entry.ranks]
    assert [p.name for p in programs] == ["transformer.rank0.pt2", "transformer.rank1.pt2"]
    assert os.path.samefile(programs[0], programs[1])  # the one SPMD program, linked per rank
    assert programs[0].read_bytes() == DOUBLE_TEXT

    state = build_program_module(planned.component("transformer"), ckpt).state_dict()
    want = {**_expected_shapes(state, specs, 2), RANK_KEY: (1,)}
    ranks = [load_file(str(out / f.weights.path)) for f in entry.ranks]
    for r, got in enumerate(ranks):
        assert {k: tuple(v.shape) for k, v in got.items()} == want
        assert torch.equal(got[RANK_KEY], torch.tensor([r], dtype=torch.int32))
    back = unshard(ranks, specs)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)

    # the denoiser's flags as argv tokens (`--target trn2`: two tokens, neuron_flags docstring)
    args = neuron_doubles.args[0]
    assert args == role_args(load_target("trn2"), "denoiser") and args[:2] == ["--target", "trn2"]
    # the module form compile_spmd traces, run on the ART's rank files in a simulated world
    from test_neuron_spmd_world import run_world

    from difflet.codegen.build import example_inputs

    pm, inputs = neuron_doubles.programs[0].eval(), example_inputs(planned.component("transformer"))
    with torch.no_grad():
        want_out = pm(*inputs)
    for got in run_world(pm, specs, ranks, inputs):
        for g, w in zip(got, want_out, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)

    again = codegen(planned, str(ckpt), tmp_path / "art2", backend="neuron", store=store, log=lambda *_: None)
    assert "transformer" in again.reused and len(neuron_doubles.calls) == 1  # the store's key, no retrace


@pytest.mark.skipif(importlib.util.find_spec("torch_neuronx") is not None, reason="the Neuron SDK is installed here")
def test_cli_tp2_neuron_codegen_without_the_sdk_exits_2_before_any_work(tmp_path):
    from difflet.ir.binary import save

    save(optimize(lower_file(str(REPO / "models" / "flux-tiny.dsl")), "tp2", target="trn2", backend="neuron"),
         tmp_path / "tp2.ir")
    r = subprocess.run([sys.executable, "-m", "difflet.cli", "codegen", str(tmp_path / "tp2.ir"), "--backend",
                        "neuron", "--weights", "random:0", "-o", str(tmp_path / "art"), "--store",
                        str(tmp_path / "store")], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: --backend: backend 'neuron' needs the Neuron SDK")
    assert not (tmp_path / "art").exists() and not (tmp_path / "store").exists()
