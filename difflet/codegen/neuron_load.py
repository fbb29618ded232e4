"""Load a neuron SPMD artifact (neuron_spmd.emit_spmd) as ONE program the host calls.

Written against neuronx-distributed of Neuron SDK 2.29 (docs libraries/neuronx-distributed/
model_builder_v2_api_reference.rst: `NxDModel.load(path_to_model, start_rank=None,
local_ranks_size=None)` restores a model saved by `NxDModel.save`, or returns the bare
TorchScript module when restoring fails; `set_weights(sharded_checkpoint)` takes one state dict
per rank before `to_neuron()` loads every rank onto its NeuronCores; `forward(*args)` in the
default mode replicates the inputs to every rank and returns rank 0's outputs in the traced
format). Untested against the SDK here: tests/test_neuron_load.py replaces it by a test double.

Invariants:
- Without the SDK, construction raises BackendUnavailable (what to install) before reading any
  file: the CLI and runtime report it as one line, exit 2.
- The program is loaded once per component: every rank's `programs/<name>.rank<r>.pt2` is a
  link to the same store entry (emit_spmd), and links whose bytes differ are refused.
- `set_weights` receives rank r's dict read unchanged from `weights/<name>.rank<r>.safetensors`,
  in rank order (keys, shapes and dtypes are the rank files'), then `to_neuron()` runs once.
- Call convention as every Program (codegen/program.py): IR inputs positionally, checked; runtime
  values go in as shape [1] (neuron_inputs.py, how the program was traced); a tuple with one
  tensor per IR output comes back, in IR order.
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


class SpmdProgram:
    """A split component's neuron SPMD program over all its ranks, called like a Program."""

    def __init__(self, node: Node, programs: list[Path], weights: list[Path]) -> None:
        from difflet.codegen.neuron import require_sdk
        from difflet.codegen.neuron_inputs import runtime_positions
        from difflet.codegen.program import Program

        require_sdk()  # before any file is read: the missing SDK is the one error the user sees
        from neuronx_distributed import NxDModel
        from safetensors.torch import load_file

        if len(programs) != len(weights) or not programs:
            raise DiffletError(f"{node.name!r}: {len(programs)} rank programs but {len(weights)} weight files",
                               where=node.loc)
        self.node, self.name, self.world = node, node.name, len(programs)
        self._vector = runtime_positions(node)
        model = NxDModel.load(str(_same_program([Path(p) for p in programs], node)))
        if not hasattr(model, "set_weights"):  # NxDModel.load's fallback: a bare TorchScript module
            raise DiffletError(f"{node.name!r}: {programs[0]} could not be restored as an NxDModel by this "
                               "neuronx-distributed (saved by another release?); re-run `difflet codegen`",
                               where=programs[0])
        model.set_weights([load_file(str(w)) for w in weights])
        model.to_neuron()
        self._model = model
        self._program = Program(node, self._run)
        self.inputs, self.outputs = self._program.inputs, self._program.outputs

    def _run(self, *tensors):
        from difflet.codegen.neuron_inputs import call_inputs

        if self._model is None:
            raise DiffletError(f"{self.name!r}: the program was closed", where=self.name)
        out = self._model(*call_inputs(self._vector, tensors))
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
    """A saved neuron program with the ART's weights swapped in: `runner(*tensors) -> tuple`."""

    def __init__(self, program_path: Path, weights_path: Path, constants_path: Path | None = None,
                 shared: dict | None = None) -> None:
        """`constants_path`/`shared`: a branch program (codegen/branches.py) reads the weights file its
        branch set shares through `shared` (path -> tensors, read once) plus its own constants."""
        import torch
        import torch_neuronx
        from safetensors.torch import load_file

        from difflet.codegen.neuron import META_FILE

        extra = {META_FILE: ""}
        self._model = torch.jit.load(str(program_path), _extra_files=extra)
        cache = shared if shared is not None else {}
        if weights_path not in cache:
            cache[weights_path] = load_file(str(weights_path))
        own = load_file(str(constants_path)) if constants_path is not None else {}
        torch_neuronx.replace_weights(self._model, {**cache[weights_path], **own})
        meta = json.loads(extra[META_FILE] or "{}")
        self._dropped = set(meta.get("dropped_outputs", ()))
        self._vector = meta.get("vector_inputs", [])

    def __call__(self, *tensors):
        from difflet.codegen.neuron_inputs import call_inputs

        out = self._model(*call_inputs(self._vector, tensors))
        out = tuple(out) if isinstance(out, (list, tuple)) else (out,)
        return tuple(t for i, t in enumerate(out) if i not in self._dropped)  # aliased state stays on device
