"""Backend dispatch: which module compiles, extracts weights and loads programs for `--backend NAME`.

Invariant: an unknown backend is a DiffletError; a known backend whose toolchain is missing raises
BackendUnavailable before anything is compiled or written.
"""
from __future__ import annotations

from pathlib import Path
from types import ModuleType

from difflet.errors import DiffletError

BACKENDS = ("inductor", "neuron")


def get_backend(name: str) -> ModuleType:
    """The backend module: `compile_entry(node, pm, dest)`, `program_weights(pm, entry)`,
    `CompiledRunner(program, weights)`, `PROGRAM_FILE`."""
    if name == "inductor":
        from difflet.codegen import inductor

        return inductor
    if name == "neuron":
        from difflet.codegen import neuron

        neuron.require_sdk()
        return neuron
    raise DiffletError(f"unknown backend {name!r} (choose one of: {', '.join(BACKENDS)})", where="--backend")


def load_runner(backend: str, program: Path, weights: Path, constants: Path | None = None,
                shared: dict | None = None):
    """A backend's loaded program; bucket and branch programs pass their `constants` file and the
    shared weights cache (path -> tensors: a weights file several programs share is read once)."""
    if constants is None:
        return get_backend(backend).CompiledRunner(program, weights)
    return get_backend(backend).CompiledRunner(program, weights, constants, shared)
