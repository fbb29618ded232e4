"""Loading a neuron ART (difflet/codegen/neuron_load.py: `SpmdProgram`, `CompiledRunner`) and the
neuron programs' runtime inputs as shape [1] (difflet/codegen/neuron_inputs.py).

There is no Neuron SDK here: `neuronx_distributed` and `torch_neuronx` are replaced in sys.modules
by TEST DOUBLES defined in this file only. Each double encodes what the SDK source or docs say
(named in its docstring) and answers nothing computed by Difflet's own code: the NxD doubles
return zeros shaped as the traced outputs, so no test here claims a Neuron program ran.
Oracles: the artifact's rank files (what set_weights must receive), the traced example inputs'
names and shapes (what NxDModel's router accepts), the documented call order of torch_neuronx.
"""
from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import inspect
import json
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
    """neuronx_distributed.NxDModel as neuronx-distributed (Release 2.29)
    src/neuronx_distributed/trace/nxd_model/nxd_model.py defines it: `__init__`'s start_rank /
    local_ranks_size assertions (start_rank None -> 0 and every rank local); `load(path_to_model,
    start_rank=None, local_ranks_size=None)` builds `NxDModel(world_size, start_rank, local_ranks_size)`;
    `set_weights` raises ValueError once loaded on neuron; `to_neuron` returns if already loaded
    (else loads whatever `weights` holds: [{}] * world before set_weights); `forward(*args,
    model_name=None, forward_mode='default', **kwargs)` raises RuntimeError before to_neuron and
    routes on "(name: [shape], ...)" (`router`: KeyError for a signature never traced), returning
    the packer's outputs, here zeros of the traced outputs' shapes (reserved_example_outputs)."""

    world = 0
    names: tuple[str, ...] = ()  # the traced forward's parameters (model_params)
    traced: tuple = ()  # example inputs the program was traced with
    out: tuple = ()  # (shape, dtype) of the traced outputs
    loads: list = []
    instances: list = []

    def __init__(self, world_size, start_rank=None, local_ranks_size=None):
        if start_rank is None:
            assert local_ranks_size is None or local_ranks_size == world_size
            start_rank, local_ranks_size = 0, world_size
        else:
            assert local_ranks_size is not None
        self.world_size, self.start_rank, self.local_ranks_size = world_size, start_rank, local_ranks_size
        self.weights, self.loaded_on_neuron, self.events, self.calls = [{}] * world_size, False, [], []
        self.input_shape_map = {self._key(NxDModelDouble.traced, NxDModelDouble.names): ["model"]}

    @staticmethod
    def _key(inputs, names):
        return "(" + ", ".join(f"{n}: {list(t.shape)}" for n, t in zip(names, inputs)) + ")"

    @classmethod
    def load(cls, path_to_model, start_rank=None, local_ranks_size=None):
        cls.loads.append((str(path_to_model), start_rank, local_ranks_size))
        model = cls(cls.world, start_rank, local_ranks_size)
        cls.instances.append(model)
        return model

    def set_weights(self, sharded_checkpoint):
        if self.loaded_on_neuron:
            raise ValueError("set_weights() was called when the model was already loaded on neuron.")
        self.events.append("set_weights")
        self.weights = sharded_checkpoint

    def to_neuron(self):
        if self.loaded_on_neuron:
            return
        self.events.append("to_neuron")
        self.loaded_on_neuron = True

    def _forward(self, inputs):
        if not self.loaded_on_neuron:
            raise RuntimeError("Model not initialized. Call set_weights() followed by to_neuron()")
        self.events.append("forward")
        self.calls.append(inputs)
        self.input_shape_map[self._key(inputs, self.names)]  # router: KeyError off the traced shapes
        return [torch.zeros(shape, dtype=dtype) for shape, dtype in NxDModelDouble.out]

    def __call__(self, *args, model_name=None, forward_mode="default", **kwargs):
        assert not kwargs and forward_mode == "default"
        return self._forward(list(args))


class TorchScriptNxDModel:
    """The class whose __name__ NxDModel.load compares (nxd_model.py); never instantiated here."""


class ScriptedTorchScriptNxDModelDouble:
    """What NxDModel.load returns when it cannot rebuild an NxDModel (nxd_model.py `load`'s except
    branch): the scripted TorchScriptNxDModel, `original_name` "TorchScriptNxDModel", its
    `nxd_model` the scripted NxDModel; `set_weights(sharded_checkpoint: List[Dict[str, Tensor]])`
    and `to_neuron()` delegate to it; `forward(args: Optional[List[Tensor]], kwargs:
    Optional[Dict[str, Tensor]])` takes ONE list (TorchScript refuses extra positionals)."""

    original_name = "TorchScriptNxDModel"

    def __init__(self, world):
        self.nxd_model = NxDModelDouble(world)

    def set_weights(self, sharded_checkpoint):
        self.nxd_model.set_weights(sharded_checkpoint)

    def to_neuron(self):
        self.nxd_model.to_neuron()

    def __call__(self, args, kwargs):
        assert kwargs is None or isinstance(kwargs, dict)
        return self.nxd_model._forward(list(args or []))


class TorchNeuronxDouble:
    """torch_neuronx as aws-neuron-sdk v2.29.1 documents it: `neuron_cores_context(start_nc, nc_count)`
    places models torch.jit.load'ed inside it (api-torch-neuronx-core-placement.rst);
    `replace_weights(neuron_model, weights)` replaces the separated weights inline, on the host
    (api-torch-neuronx-replace-weights.rst); `move_trace_to_device(trace, device_id)` puts them on
    core device_id in place (api-torch-neuronx-trace.rst); a weight-separated model whose weights are
    not on the device copies them host -> device on every call (that page's warning): `copies`."""

    def __init__(self):
        self.events, self.on_device, self.context = [], {}, None

    @contextlib.contextmanager
    def neuron_cores_context(self, start_nc=-1, nc_count=-1):
        self.events.append(("context", start_nc, nc_count))
        self.context = start_nc
        try:
            yield
        finally:
            self.context = None

    def replace_weights(self, neuron_model, weights):
        self.events.append(("replace_weights", id(neuron_model)))
        with torch.no_grad():
            for name, t in neuron_model.state_dict().items():  # inline, as documented
                t.copy_(weights[name])
        self.on_device[id(neuron_model)] = None  # the new weights are host tensors

    def move_trace_to_device(self, trace, device_id):
        self.events.append(("move_trace_to_device", id(trace), device_id))
        self.on_device[id(trace)] = device_id

    def copies(self, model, calls):
        return 0 if self.on_device.get(id(model)) is not None else calls


@pytest.fixture
def sdk_double(monkeypatch):
    """Both SDK packages present (require_sdk passes): NxDModel, TorchScriptNxDModel and torch_neuronx
    the doubles; no model-process placement in the environment (one chip, no /dev/neuron*)."""
    NxDModelDouble.loads, NxDModelDouble.instances = [], []
    neuronx = TorchNeuronxDouble()
    for name in ("torch_neuronx", "neuronx_distributed"):
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)  # find_spec reads it from sys.modules
        monkeypatch.setitem(sys.modules, name, mod)
    sys.modules["neuronx_distributed"].NxDModel = NxDModelDouble
    sys.modules["neuronx_distributed"].TorchScriptNxDModel = TorchScriptNxDModel
    for fn in ("neuron_cores_context", "replace_weights", "move_trace_to_device"):
        setattr(sys.modules["torch_neuronx"], fn, getattr(neuronx, fn))
    for var in ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "DIFFLET_NEURON_PLACEMENT"):
        monkeypatch.delenv(var, raising=False)
    return types.SimpleNamespace(nxd=NxDModelDouble, neuronx=neuronx)


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


def _load_transformer(out: Path):
    from difflet.codegen.artifacts import _load_entry
    from difflet.codegen.manifest import read_manifest
    from difflet.ir import binary

    manifest = read_manifest(out)
    module = binary.load(out / manifest.module.path)
    entry = manifest.components["transformer"]
    return _load_entry(out, manifest, module.component("transformer"), "transformer", entry, verify=True), entry


def _traced_signature(planned, ckpt, sdk):
    """What emit_spmd traced the transformer with: its input names, example inputs, output shapes."""
    from difflet.codegen.build import build_program_module, example_inputs
    from difflet.codegen.neuron_inputs import input_names, runtime_positions, trace_inputs

    node = planned.component("transformer")
    with torch.no_grad():
        want = build_program_module(node, ckpt)(*example_inputs(node))
    sdk.nxd.world, sdk.nxd.names, sdk.nxd.traced = 2, tuple(input_names(node)), trace_inputs(node)
    sdk.nxd.out = tuple((tuple(t.shape), t.dtype) for t in want)
    return node, list(example_inputs(node)), runtime_positions(node)


def _check_rank_files(weights, entry, out):
    from safetensors.torch import load_file

    assert len(weights) == 2  # one dict per local rank (NxD Inference application_base.load_weights)
    for r, files in enumerate(entry.ranks):  # rank r's dict is rank r's file, unchanged
        want = load_file(str(out / files.weights.path))
        assert weights[r].keys() == want.keys()
        assert all(torch.equal(weights[r][k], want[k]) and weights[r][k].dtype == want[k].dtype for k in want)


def test_spmd_program_holds_every_rank_from_core_0_sets_the_rank_files_and_calls_as_traced(tp2_art, sdk_double):
    from difflet.codegen.neuron_load import SpmdProgram

    planned, ckpt, out = tp2_art
    node, inputs, pos = _traced_signature(planned, ckpt, sdk_double)
    assert pos  # flux's denoiser takes valid_text
    prog, entry = _load_transformer(out)
    assert isinstance(prog, SpmdProgram) and prog.world == 2
    # finding 9a: start_rank is a rank (nxd_model.py); this process holds both, given explicitly
    assert sdk_double.nxd.loads == [(str(out / entry.ranks[0].program.path), 0, 2)]
    (model,) = sdk_double.nxd.instances
    assert model.events == ["set_weights", "to_neuron"] and (model.start_rank, model.local_ranks_size) == (0, 2)
    _check_rank_files(model.weights, entry, out)

    for i in pos:
        inputs[i] = torch.tensor(3, dtype=inputs[i].dtype)  # not the traced upper bound
    got = prog(*inputs)  # the router accepts it: runtime values went in as the traced [1]
    assert [v.name for v in prog.outputs] == [n.results[0].name for n in node.find("output")]
    assert [tuple(g.shape) for g in got] == [tuple(v.type.shape) for v in prog.outputs]
    assert all(a is b or torch.equal(a.reshape(b.shape), b) for a, b in zip(model.calls[0], inputs))
    with pytest.raises(DiffletError, match="valid_text"):  # the Program call convention's checks
        prog(*[torch.tensor(10**6) if i in pos else t for i, t in enumerate(inputs)])
    prog.close()
    with pytest.raises(DiffletError, match="closed"):
        prog(*inputs)


def test_the_torchscript_fallback_of_nxdmodel_load_is_driven_with_its_own_signature(tp2_art, sdk_double,
                                                                                   monkeypatch):
    """Finding 9a: the fallback has set_weights too; it is recognised as NxDModel.load recognises
    it (original_name) and called with forward(args, kwargs), not *args."""
    planned, ckpt, out = tp2_art
    _, inputs, _ = _traced_signature(planned, ckpt, sdk_double)
    made = []
    monkeypatch.setattr(sdk_double.nxd, "load", classmethod(
        lambda cls, path, start_rank=None, local_ranks_size=None: made.append(
            ScriptedTorchScriptNxDModelDouble(cls.world)) or made[-1]))
    prog, entry = _load_transformer(out)
    (model,) = made
    inner = model.nxd_model
    assert inner.events == ["set_weights", "to_neuron"] and (inner.start_rank, inner.local_ranks_size) == (0, 2)
    _check_rank_files(inner.weights, entry, out)
    assert len(prog(*inputs)) == len(prog.outputs) and inner.events[-1] == "forward"


def test_a_file_nxdmodel_save_did_not_write_is_a_difflet_error(tp2_art, sdk_double, monkeypatch):
    def load(cls, path, start_rank=None, local_ranks_size=None):  # nxd_model.py NxDModel.load's check
        raise ValueError("The Torchscript Model Supplied was not produced with the NxDModel.save method.")

    monkeypatch.setattr(sdk_double.nxd, "load", classmethod(load))
    with pytest.raises(DiffletError, match="not produced with the NxDModel.save"):
        _load_transformer(tp2_art[2])


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x):
        y = self.lin(x)
        return y, y * 2  # the second: an aliased state output the runner drops


def test_compiled_runner_places_the_program_and_moves_its_weights_to_the_device_once(tmp_path, sdk_double,
                                                                                     monkeypatch):
    """Finding 7 (weights on the device once, after replace_weights) and 9b (on its placed core)."""
    from safetensors.torch import save_file

    from difflet.codegen.neuron import META_FILE
    from difflet.codegen.neuron_load import CompiledRunner
    from difflet.codegen.neuron_placement import PLACEMENT_ENV

    (tmp_path / "programs").mkdir()
    program, weights = tmp_path / "programs" / "vae.pt", tmp_path / "weights.safetensors"
    torch.jit.save(torch.jit.script(_Tiny()), str(program),
                   _extra_files={META_FILE: json.dumps({"dropped_outputs": [1], "vector_inputs": []})})
    art = _Tiny()  # the ART's weights: not the saved program's
    save_file({k: v.contiguous() for k, v in art.state_dict().items()}, str(weights))
    monkeypatch.setenv(PLACEMENT_ENV, json.dumps({"programs/vae.pt": [3, 1]}))

    runner = CompiledRunner(program, weights)
    nx = sdk_double.neuronx
    mid = id(runner._model)
    assert nx.events == [("context", 3, 1), ("replace_weights", mid), ("move_trace_to_device", mid, 3)]
    x = torch.randn(4, 3)
    outs = [runner(x) for _ in range(3)]
    assert nx.events[3:] == [] and nx.copies(runner._model, calls=3) == 0  # no per-call weight copy
    with torch.no_grad():
        want = art(x)[0]
    assert all(len(o) == 1 and torch.allclose(o[0], want) for o in outs)  # the ART's weights, output 1 dropped


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
    assert sdk_double.nxd.loads == []


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
