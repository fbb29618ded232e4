"""Loading a neuron SPMD artifact (difflet/codegen/neuron_load.py `SpmdProgram`) and the neuron
programs' runtime inputs as shape [1] (difflet/codegen/neuron_inputs.py).

Oracles: the artifact's own rank files (what `set_weights` must receive, key for key), the
unsplit eager program module built from the same checkpoint (what a call must return, in IR
order), and the IR's input/output types. There is no Neuron SDK here: `neuronx_distributed` and
`torch_neuronx` are replaced in sys.modules by TEST DOUBLES defined in this file only; the NxDModel
double rebuilds the full weights from the rank dicts it is given (neuron_spmd.unshard) and runs
the eager module, so nothing here claims a Neuron program ran.
"""
from __future__ import annotations

import importlib.machinery
import inspect
import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from difflet.errors import BackendUnavailable, DiffletError
from difflet.frontend.lower import lower_file
from difflet.passes.pipeline import optimize

REPO = Path(__file__).resolve().parent.parent
NO_SDK = importlib.util.find_spec("torch_neuronx") is None
needs_no_sdk = pytest.mark.skipif(not NO_SDK, reason="the Neuron SDK is installed here")


# --- TEST DOUBLES of the Neuron SDK (defined here only; difflet never imports them) ---

class NxDModelDouble:
    """Stands in for neuronx_distributed.NxDModel: records load / set_weights / to_neuron / calls;
    a call checks the runtime inputs arrive as shape [1] and runs `eager` with the full weights."""

    loads: list[str] = []
    instances: list["NxDModelDouble"] = []
    eager = None  # (program module, linear specs) set by the test
    runtime_positions: tuple[int, ...] = ()

    def __init__(self) -> None:
        self.weights, self.on_neuron, self.calls = None, 0, []

    @classmethod
    def load(cls, path_to_model, start_rank=None, local_ranks_size=None):
        cls.loads.append(str(path_to_model))
        model = cls()
        cls.instances.append(model)
        return model

    def set_weights(self, sharded_checkpoint):
        assert not self.on_neuron, "set_weights after to_neuron"
        self.weights = sharded_checkpoint

    def to_neuron(self):
        assert self.weights is not None, "to_neuron before set_weights"
        self.on_neuron += 1

    def __call__(self, *args):
        from difflet.codegen.neuron_spmd import unshard

        assert self.on_neuron == 1
        self.calls.append(args)
        pm, specs = NxDModelDouble.eager
        for i in NxDModelDouble.runtime_positions:
            assert args[i].shape == (1,), f"runtime input {i} must be traced/fed as shape [1]"
        pm.load_state_dict(unshard(self.weights, specs))
        with torch.no_grad():
            return list(pm(*(a.reshape(()) if i in NxDModelDouble.runtime_positions else a
                              for i, a in enumerate(args))))


@pytest.fixture
def sdk_double(monkeypatch):
    """Both SDK packages present (require_sdk passes), neuronx_distributed.NxDModel the double."""
    NxDModelDouble.loads, NxDModelDouble.instances = [], []
    for name in ("torch_neuronx", "neuronx_distributed"):
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)  # find_spec reads it from sys.modules
        monkeypatch.setitem(sys.modules, name, mod)
    sys.modules["neuronx_distributed"].NxDModel = NxDModelDouble
    return NxDModelDouble


@pytest.fixture(scope="module")
def tp2_art(tmp_path_factory):
    """A flux-tiny tp2 neuron artifact from codegen, its SDK compile calls replaced by placeholders."""
    from oracle_util import random_checkpoint

    from difflet.codegen import neuron, neuron_spmd
    from difflet.codegen.driver import codegen

    planned = optimize(lower_file(str(REPO / "models" / "flux-tiny.dsl")), "tp2", target="trn2", backend="neuron")
    ckpt = random_checkpoint(planned)
    out = tmp_path_factory.mktemp("neuron-tp2") / "art"
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(neuron, "require_sdk", lambda: None)
        mp.setattr(neuron, "compile_entry", lambda node, pm, dest: (dest / neuron.PROGRAM_FILE).write_bytes(b"double"))
        mp.setattr(neuron_spmd, "compile_spmd",
                   lambda node, pm, specs, tp, dest, args: (dest / neuron_spmd.PROGRAM_FILE).write_bytes(b"double"))
        mp.setenv("DIFFLET_COMPILE_WORKERS", "1")  # spawned workers would not see the doubles
        codegen(planned, str(ckpt), out, backend="neuron", store=out.parent / "store", log=lambda *_: None)
    finally:
        mp.undo()
    return planned, ckpt, out


def _load_transformer(out: Path):
    from difflet.codegen.artifacts import _load_entry
    from difflet.codegen.manifest import read_manifest
    from difflet.ir import binary

    manifest = read_manifest(out)
    module = binary.load(out / manifest.module.path)
    entry = manifest.components["transformer"]
    return _load_entry(out, manifest, module.component("transformer"), "transformer", entry, verify=True), entry


def test_spmd_program_loads_once_sets_the_rank_files_and_calls_in_ir_order(tp2_art, sdk_double):
    from safetensors.torch import load_file

    from difflet.codegen.build import build_program_module, example_inputs
    from difflet.codegen.neuron_inputs import runtime_positions
    from difflet.codegen.neuron_load import SpmdProgram
    from difflet.codegen.neuron_spmd import linear_specs

    planned, ckpt, out = tp2_art
    node = planned.component("transformer")
    pm = build_program_module(node, ckpt)
    sdk_double.eager = (build_program_module(node, ckpt), linear_specs(node, pm.model))
    sdk_double.runtime_positions = tuple(runtime_positions(node))
    assert sdk_double.runtime_positions  # flux's denoiser takes valid_text

    prog, entry = _load_transformer(out)
    assert isinstance(prog, SpmdProgram) and prog.world == 2
    assert sdk_double.loads == [str(out / entry.ranks[0].program.path)]  # one program for both ranks
    (model,) = sdk_double.instances
    assert model.on_neuron == 1 and len(model.weights) == 2
    for r, files in enumerate(entry.ranks):  # rank r's dict is rank r's file, unchanged
        want = load_file(str(out / files.weights.path))
        assert model.weights[r].keys() == want.keys()
        assert all(torch.equal(model.weights[r][k], want[k]) and model.weights[r][k].dtype == want[k].dtype
                   for k in want)

    inputs = list(example_inputs(node))
    for i in sdk_double.runtime_positions:
        inputs[i] = torch.tensor(3, dtype=inputs[i].dtype)  # not the traced upper bound
    got = prog(*inputs)
    with torch.no_grad():
        want = pm(*inputs)
    assert [v.name for v in prog.outputs] == [n.results[0].name for n in node.find("output")]
    assert len(got) == len(prog.outputs) == len(want)
    for g, w, v in zip(got, want, prog.outputs):
        assert tuple(g.shape) == tuple(v.type.shape) and torch.equal(g, w)
    assert all(a is b or torch.equal(a.reshape(b.shape), b) for a, b in zip(model.calls[0], inputs))

    with pytest.raises(DiffletError, match="valid_text"):  # the Program call convention's checks
        prog(*[torch.tensor(10**6) if i in sdk_double.runtime_positions else t for i, t in enumerate(inputs)])
    prog.close()
    with pytest.raises(DiffletError, match="closed"):
        prog(*inputs)


def test_rank_programs_that_differ_are_refused(tp2_art, sdk_double, tmp_path):
    import shutil

    from difflet.codegen.neuron_load import SpmdProgram

    planned, _, out = tp2_art
    a, b = tmp_path / "a.pt2", tmp_path / "b.pt2"
    shutil.copy(out / "programs" / "transformer.rank0.pt2", a)
    b.write_bytes(b"another program")
    weights = [out / "weights" / f"transformer.rank{r}.safetensors" for r in range(2)]
    with pytest.raises(DiffletError, match="rank 1's program differs"):
        SpmdProgram(planned.component("transformer"), [a, b], weights)
    assert sdk_double.loads == []


def test_a_bare_torchscript_fallback_of_nxdmodel_load_is_refused(tp2_art, sdk_double, monkeypatch):
    # NxDModel.load returns the bare TorchScript module when it cannot restore an NxDModel
    monkeypatch.setattr(sdk_double, "load", classmethod(lambda cls, path, start_rank=None, local_ranks_size=None:
                                                        object()))
    with pytest.raises(DiffletError, match="could not be restored as an NxDModel"):
        _load_transformer(tp2_art[2])


@needs_no_sdk
def test_without_the_sdk_loading_names_what_to_install(tp2_art):
    from difflet.codegen.split_codegen import split_program

    planned, _, out = tp2_art
    with pytest.raises(BackendUnavailable, match="needs the Neuron SDK"):
        split_program(planned.component("transformer"), "neuron", [out / "programs" / "transformer.rank0.pt2"] * 2,
                      [out / "weights" / f"transformer.rank{r}.safetensors" for r in range(2)])


@needs_no_sdk
def test_runtime_cli_on_a_neuron_artifact_without_the_sdk_exits_2_naming_it(tp2_art):
    r = subprocess.run([sys.executable, "-m", "difflet.runtime.server", "--artifacts", str(tp2_art[2]),
                        "--port", "0"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "needs the Neuron SDK" in r.stderr and "torch_neuronx" in r.stderr, r.stderr


def test_runtime_inputs_go_in_as_shape_1_with_the_same_results():
    from oracle_util import random_checkpoint

    from difflet.codegen.build import build_program_module, example_inputs
    from difflet.codegen.neuron_inputs import (call_inputs, explicit_signature, input_names, runtime_positions,
                                               trace_inputs, vector_runtime_inputs)

    module = lower_file(str(REPO / "models" / "flux-tiny.dsl"))
    node = module.component("transformer")
    pm = build_program_module(node, random_checkpoint(module))
    pos = runtime_positions(node)
    inputs = example_inputs(node)
    with torch.no_grad():
        want = pm(*inputs)
    keys, names = list(pm.state_dict()), input_names(node)
    vector_runtime_inputs(pm, pos, names)
    explicit_signature(pm, node)
    assert list(pm.state_dict()) == keys  # a hook, not a wrapper: rank-file keys still match
    # NxD ModelBuilder V2 refuses *args forwards (trace/functions.py _validate_model) and passes inputs by name
    params = inspect.signature(pm.forward).parameters
    assert list(params) == names and all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params.values())
    with torch.no_grad():
        by_name = pm(**dict(zip(names, call_inputs(pos, inputs))))
    assert all(torch.equal(g, w) for g, w in zip(by_name, want, strict=True))
    traced = trace_inputs(node)
    assert [tuple(t.shape) for i, t in enumerate(traced) if i in pos] == [(1,)] * len(pos)
    with torch.no_grad():
        got = pm(*call_inputs(pos, inputs))
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
