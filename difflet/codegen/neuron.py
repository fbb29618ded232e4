"""The `neuron` backend (Trainium2): torch-neuronx / neuronx-distributed, imported lazily.

Written against the documented Neuron SDK APIs and untested here: this machine has no Neuron SDK
(PyPI carries only placeholder wheels for it), so `require_sdk()` raises BackendUnavailable with
what to install and where. Nothing is ever faked: without the SDK no program is produced.

Plan (per docs): single-core components via `torch_neuronx.trace(module, example_inputs)` saved
with `torch.jit.save`; tensor-parallel components via `neuronx_distributed.trace.model_builder.
ModelBuilder` with weights presharded per rank; attention via the NKI kernel of difflet/kernels/README.md.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from difflet.errors import BackendUnavailable

PROGRAM_FILE = "program.pt"
INSTALL_HINT = ("install the AWS Neuron SDK on a Trainium (trn2) host: "
                "`pip install torch-neuronx neuronx-cc neuronx-distributed "
                "--extra-index-url https://pip.repos.neuron.amazonaws.com` "
                "(see https://awsdocs-neuron.readthedocs-hosted.com/ for the setup guide)")


def require_sdk() -> None:
    """Raise BackendUnavailable unless torch_neuronx and neuronx_distributed are importable."""
    missing = [m for m in ("torch_neuronx", "neuronx_distributed") if importlib.util.find_spec(m) is None]
    if missing:
        raise BackendUnavailable(f"backend 'neuron' needs the Neuron SDK ({', '.join(missing)} not installed); "
                                 + INSTALL_HINT, where="--backend")


def compile_entry(node, pm, dest: Path) -> None:
    """Trace `pm` for one NeuronCore (tp1). TP layouts go through ModelBuilder (not written yet)."""
    import torch
    import torch_neuronx

    from difflet.codegen.build import example_inputs

    layout = node.find("layout")
    if layout and any(n.op == "split" for n in layout[0].body):
        raise BackendUnavailable("backend 'neuron': tensor-parallel layouts (ModelBuilder) are not "
                                 "implemented yet; use --parallel tp1", where=node.loc)
    traced = torch_neuronx.trace(pm, example_inputs(node))
    torch.jit.save(traced, str(dest / PROGRAM_FILE))


def program_weights(pm, entry: Path) -> dict:
    """torch_neuronx.trace embeds the weights in the program, so there is no separate weight file."""
    return {}


class CompiledRunner:
    def __init__(self, program_path: Path, weights_path: Path) -> None:
        import torch
        import torch_neuronx  # noqa: F401  (registers the Neuron runtime ops)

        self._model = torch.jit.load(str(program_path))

    def __call__(self, *tensors):
        out = self._model(*tensors)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)
