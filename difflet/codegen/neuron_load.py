"""Load a neuron ART's programs: `SpmdProgram` (a split component's NxD SPMD program, all ranks)
and `CompiledRunner` (a tp1 torch_neuronx trace), each on the NeuronCores its placement names
(codegen/neuron_placement.py). Targets Neuron SDK 2.29; untested against the SDK here (no SDK on
this host): tests/test_neuron_load.py drives both through doubles that encode the SDK sources.

SDK contract followed (neuronx-distributed src/neuronx_distributed/trace/nxd_model/nxd_model.py):
- `NxDModel.load(path, start_rank, local_ranks_size)` returns an `NxDModel` when it can rebuild one,
  else the loaded TorchScript module (a scripted `TorchScriptNxDModel`, recognised as load itself
  does: `original_name`); it raises ValueError for a file NxDModel.save did not write.
- Both take `set_weights(List[Dict[str, Tensor]])` (one dict per local rank) before `to_neuron()`;
  `set_weights` after `to_neuron` raises ValueError, forward before it RuntimeError.
- `NxDModel.forward(*args)` routes on the inputs' names and shapes and returns rank 0's outputs;
  `TorchScriptNxDModel.forward(args: Optional[List[Tensor]], kwargs: Optional[Dict])` takes a list.
- start_rank is a rank, not a core: this process holds every rank (start_rank=0,
  local_ranks_size=world) on its first `world` visible cores (see neuron_placement).
torch_neuronx (docs v2.29.1 api-torch-neuronx-trace.rst, -replace-weights.rst, -core-placement.rst;
order as neuronx-distributed src/neuronx_distributed/trace/trace.py): `torch.jit.load` inside
`neuron_cores_context(start_nc=core)`, then `replace_weights`, then `move_trace_to_device(model, core)`
once: a weight-separated trace otherwise copies its weights host -> device on every call.

Invariants:
- Without the SDK, construction raises BackendUnavailable (what to install) before reading any file.
- One program per split component: every rank's `programs/<name>.rank<r>.pt2` links the same
  store entry (emit_spmd); links whose bytes differ are refused.
- `set_weights` receives rank r's dict read unchanged from `weights/<name>.rank<r>.safetensors`,
  in rank order; then `to_neuron()` runs once. A call never moves weights.
- Call convention as every Program (codegen/program.py): IR inputs positionally, checked; runtime
  values go in as shape [1] (neuron_inputs.py); a tuple with one tensor per IR output comes back.
"""
from __future__ import annotations

import filecmp
import json
from pathlib import Path

from difflet.errors import DiffletError
from difflet.ir.nodes import Node


def _same_program(programs: list[Path], node: Node) -> Path:
    """The one SPMD program file behind every rank's link."""
    first = programs[0]
    for r, p in enumerate(programs[1:], start=1):
        if not filecmp.cmp(first, p, shallow=False):
            raise DiffletError(f"{node.name!r}: rank {r}'s program differs from rank 0's; a neuron SPMD "
                               "artifact links one program for every rank (re-run `difflet codegen`)", where=p)
    return first


def _restore(path: Path, node: Node, world: int):
    """(model, scripted): NxDModel.load's result on this process's cores, told apart as load does."""
    from neuronx_distributed import NxDModel, TorchScriptNxDModel

    from difflet.codegen.neuron_placement import slot_of

    start, count = slot_of(path)
    if (start, count) != (0, world):
        raise DiffletError(f"{node.name!r}: placed on cores [{start}, {start + count}) but an SPMD program's "
                           f"{world} local ranks take the process's first {world} cores", where=path)
    try:  # nxd_model.py NxDModel.load: start_rank/local_ranks_size are ranks held by this process
        model = NxDModel.load(str(path), start_rank=0, local_ranks_size=world)
    except ValueError as err:  # nxd_model.py NxDModel.load: not written by NxDModel.save
        raise DiffletError(f"{node.name!r}: {err}; re-run `difflet codegen`", where=path) from None
    if isinstance(model, NxDModel):
        return model, False
    if getattr(model, "original_name", None) == TorchScriptNxDModel.__name__:  # nxd_model.py load's fallback
        # nxd_model.py NxDModel.load sets these on the scripted model first thing (kept if it failed later)
        model.nxd_model.start_rank, model.nxd_model.local_ranks_size = 0, world
        return model, True
    raise DiffletError(f"{node.name!r}: NxDModel.load returned a {type(model).__name__}, neither an NxDModel "
                       "nor a TorchScriptNxDModel", where=path)


class SpmdProgram:
    """A split component's neuron SPMD program over all its ranks, called like a Program."""

    def __init__(self, node: Node, programs: list[Path], weights: list[Path]) -> None:
        from difflet.codegen.neuron import require_sdk
        from difflet.codegen.neuron_inputs import runtime_positions
        from difflet.codegen.program import Program

        require_sdk()  # before any file is read: the missing SDK is the one error the user sees
        from safetensors.torch import load_file

        if len(programs) != len(weights) or not programs:
            raise DiffletError(f"{node.name!r}: {len(programs)} rank programs but {len(weights)} weight files",
                               where=node.loc)
        self.node, self.name, self.world = node, node.name, len(programs)
        self._vector = runtime_positions(node)
        path = _same_program([Path(p) for p in programs], node)
        model, self._scripted = _restore(path, node, self.world)
        inner = model.nxd_model if self._scripted else model
        if inner.loaded_on_neuron:  # nxd_model.py load: weights saved in the program; set_weights would refuse
            raise DiffletError(f"{node.name!r}: the program carries its own weights (saved with save_weights); "
                               "a store entry holds none: re-run `difflet codegen`", where=path)
        model.set_weights([load_file(str(w)) for w in weights])  # nxd_model.py set_weights: one dict per rank
        model.to_neuron()  # nxd_model.py to_neuron: every local rank onto its core, weights included
        self._model = model
        self._program = Program(node, self._run)
        self.inputs, self.outputs = self._program.inputs, self._program.outputs

    def _run(self, *tensors):
        from difflet.codegen.neuron_inputs import call_inputs

        if self._model is None:
            raise DiffletError(f"{self.name!r}: the program was closed", where=self.name)
        args = list(call_inputs(self._vector, tensors))
        # nxd_model.py: TorchScriptNxDModel.forward(args, kwargs) takes a list; NxDModel.forward(*args)
        out = self._model(args, None) if self._scripted else self._model(*args)
        out = tuple(out) if isinstance(out, (list, tuple)) else (out,)
        if len(out) != len(self.outputs):
            raise DiffletError(f"{self.name!r}: the neuron program returned {len(out)} outputs, the IR has "
                               f"{len(self.outputs)} ({', '.join(v.name for v in self.outputs)})", where=self.name)
        return out

    def __call__(self, *tensors):
        return self._program(*tensors)

    def close(self) -> None:
        """Drop the loaded model (idempotent); the SDK frees its NeuronCore memory with it."""
        self._model = None

    def __repr__(self) -> str:
        return f"SpmdProgram({self.name}: {self.world} ranks, neuron)"


class CompiledRunner:
    """A saved tp1 neuron program on its placed core, the ART's weights on the device once:
    `runner(*tensors) -> tuple`."""

    def __init__(self, program_path: Path, weights_path: Path, constants_path: Path | None = None,
                 shared: dict | None = None) -> None:
        """`constants_path`/`shared`: a branch program (codegen/branches.py) reads the weights file its
        branch set shares through `shared` (path -> tensors, read once) plus its own constants."""
        import torch
        import torch_neuronx
        from safetensors.torch import load_file

        from difflet.codegen.neuron import META_FILE
        from difflet.codegen.neuron_placement import slot_of

        self.core, _ = slot_of(program_path)  # relative to this process's NEURON_RT_VISIBLE_CORES
        extra = {META_FILE: ""}
        # api-torch-neuronx-core-placement.rst: the NEFF loads straight onto `start_nc` inside the context
        with torch_neuronx.neuron_cores_context(start_nc=self.core, nc_count=1):
            self._model = torch.jit.load(str(program_path), _extra_files=extra)
        cache = shared if shared is not None else {}
        if weights_path not in cache:
            cache[weights_path] = load_file(str(weights_path))
        own = load_file(str(constants_path)) if constants_path is not None else {}
        # api-torch-neuronx-replace-weights.rst: the ART's weights into the weight-separated trace (host)
        torch_neuronx.replace_weights(self._model, {**cache[weights_path], **own})
        # api-torch-neuronx-trace.rst move_trace_to_device: weights onto the core once; after replace_weights
        # as neuronx-distributed src/neuronx_distributed/trace/trace.py (_load_weights, then _load) orders them
        torch_neuronx.move_trace_to_device(self._model, self.core)
        meta = json.loads(extra[META_FILE] or "{}")
        self._dropped = set(meta.get("dropped_outputs", ()))
        self._vector = meta.get("vector_inputs", [])

    def __call__(self, *tensors):
        from difflet.codegen.neuron_inputs import call_inputs

        out = self._model(*call_inputs(self._vector, tensors))
        out = tuple(out) if isinstance(out, (list, tuple)) else (out,)
        return tuple(t for i, t in enumerate(out) if i not in self._dropped)  # aliased state stays on device
