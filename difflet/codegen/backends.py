"""Backend objects: a backend's declaration (passes/backend_facts.py) with its compile and load behaviour.

Invariants:
- An unknown backend is a DiffletError; a known backend whose toolchain is missing raises
  BackendUnavailable (its module's `require_sdk`) before anything is compiled or written.
- Generic codegen asks the object (`be.spmd_splits`, `be.compile_entry(...)`, `be.load(...)`) and
  never compares backend names: the names appear only here (BEHAVIOUR) and in
  backend_facts.BACKENDS, and every declaration has its behaviour (tests/test_codegen_backends.py).
- Module functions are looked up when called, so a test double put on the module is the one run.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from difflet.errors import DiffletError
from difflet.passes.backend_facts import BackendFacts, backend_facts


@dataclass(frozen=True)
class Backend(BackendFacts):
    """A declared backend (name, compiler identity, capabilities) and what compiles and loads its
    programs: `module` (compile_entry, program_weights, PROGRAM_FILE, optional require_sdk);
    `runner` (default: the module's CompiledRunner) loads one program; `rank_runner` / `prepare_rank_loads` for the programs rank workers load (default:
    the module's CompiledRunner); `spmd_program` for an spmd_splits backend."""

    module: ModuleType | None = None
    runner: Callable[..., Any] | None = None
    rank_runner: Callable[[Path, Path], Any] | None = None
    prepare_rank_loads: Callable[[], None] = lambda: None
    spmd_program: Callable[..., Any] | None = None

    @property
    def PROGRAM_FILE(self) -> str:  # noqa: N802 - the modules' constant, under its name
        return self.module.PROGRAM_FILE

    def require(self) -> "Backend":
        """Self, once the toolchain is importable (BackendUnavailable, with what to install, if not)."""
        check = getattr(self.module, "require_sdk", None)
        if check is not None:
            check()
        return self

    def compile_entry(self, node, pm, dest: Path, device: str | None = None) -> None:
        """Compile program module `pm` of `node` into the store entry directory `dest`, for the
        target's `device` where the backend compiles for devices (`devices`; default the CPU)."""
        if self.devices:
            self.module.compile_entry(node, pm, dest, device=device or "cpu")
        else:
            self.module.compile_entry(node, pm, dest)

    def require_device(self, device: str | None) -> "Backend":
        """Self, once programs for the target's `device` can be compiled here (DiffletError naming
        the target's device otherwise); a backend without `devices` places its programs itself."""
        if device is None or not self.devices:
            return self
        if device not in self.devices:
            raise DiffletError(f"the {self.name} backend compiles programs for {', '.join(self.devices)}, "
                               f"not the target's device {device!r}", where="target")
        self.module.require_device(device)
        return self

    def program_weights(self, pm, entry: Path) -> dict:
        """The tensors the program in `entry` loads, taken from `pm` (the checkpoint) and the entry."""
        return self.module.program_weights(pm, entry)

    def load(self, program: Path, weights: Path, constants: Path | None = None, shared: dict | None = None):
        """A loaded program; bucket and branch programs pass their `constants` file and the shared
        weights cache (path -> tensors: a weights file several programs share is read once)."""
        runner = self.runner or self.module.CompiledRunner
        if constants is None:
            return runner(program, weights)
        return runner(program, weights, constants, shared)

    def load_rank(self, program: Path, weights: Path, constants: Path | None = None, shared: dict | None = None):
        """The program a rank worker runs, with its presharded weights (`constants`/`shared`: as `load`)."""
        if self.rank_runner is None:
            return self.load(program, weights, constants, shared)
        return self.rank_runner(program, weights) if constants is None else \
            self.rank_runner(program, weights, constants, shared)


def _inductor() -> dict[str, Any]:
    from difflet.codegen import inductor
    from difflet.parallel import aoti_runner

    # rank programs run with the GIL released (aoti_runner: torch's binding holds it across the
    # collective waits a gloo thread may need it for); its shim is built once, in the parent
    return dict(module=inductor, rank_runner=aoti_runner.NoGilRunner, prepare_rank_loads=aoti_runner.build)


def _neuron() -> dict[str, Any]:
    from difflet.codegen import neuron, neuron_load

    # a split layout is one NxD SPMD program run from this process (neuron_load), no rank workers
    return dict(module=neuron, runner=neuron_load.CompiledRunner, spmd_program=neuron_load.SpmdProgram)


BEHAVIOUR: dict[str, Callable[[], dict[str, Any]]] = {"inductor": _inductor, "neuron": _neuron}


def get_backend(name: str) -> Backend:
    """The backend object of `name`, its toolchain checked (module invariants)."""
    facts = backend_facts(name)
    declared = {f.name: getattr(facts, f.name) for f in fields(BackendFacts)}
    return Backend(**declared, **BEHAVIOUR[name]()).require()


def load_runner(backend: str, program: Path, weights: Path, constants: Path | None = None,
                shared: dict | None = None):
    """`get_backend(backend).load(...)`: a backend's loaded program."""
    return get_backend(backend).load(program, weights, constants, shared)
