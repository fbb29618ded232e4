"""The codegen backends as torch-free declarations: what the planner and codegen ask of a backend.

Each `BackendFacts` states a backend's identity in the cache key (its name, the compiler package
whose version keys every program, its compiler-flags key part) and its capabilities; generic code
asks a capability (`facts.spmd_splits`, `facts.parallel_compiles`, ...) and never compares a
backend's name (the habit of Triton's `make_backend(target)`). codegen/backends.py pairs each
declaration with the module that compiles and loads its programs.

Invariants:
- Torch-free (passes read it); BACKENDS is the single list of backend names (CLI choices included).
- Every backend keeps weights out of its programs (the cache key excludes weights: one program
  serves every checkpoint of a config), so no declaration has a weights capability to read.
- `key_part(target)` is {} for a backend without compiler flags: such a key is exactly its name,
  its compiler version and the component's inputs (passes/cache_key.py). Inductor's flags are the
  target's device when it is not the CPU (a CUDA program never answers a CPU key, nor the reverse).
- A backend that builds split programs builds them either as per-rank programs compiled in rank
  workers or (`spmd_splits`) as one SPMD program for every rank: tp-only, for the classes each
  family lists in `spmd_built` (passes/built.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from difflet.errors import DiffletError
from difflet.passes import neuron_flags


@dataclass(frozen=True)
class BackendFacts:
    name: str
    compiler: str  # the distribution whose installed version is the key's "compiler" input
    toolchain: tuple[str, ...] = ()  # further distributions that build or trace this backend's programs
    split_programs: bool = False  # builds layouts of more than one rank
    spmd_splits: bool = False  # a split layout is one SPMD program for all ranks, not a program per rank
    parallel_compiles: bool = False  # missing programs compile concurrently in worker processes
    shape_buckets: bool = False  # builds shape-bucket programs (one per size, shared weights file)
    block_programs: bool = False  # builds block mode's front and rest programs (shared weights file)
    flags: Callable[[str], dict[str, Any]] | None = None  # target name -> the key's compiler-flags part
    attention: str = "fused"  # the bounded-attention kernel its programs call (kernels/select.py IMPLEMENTATIONS)
    devices: tuple[str, ...] = ()  # torch devices it compiles for (a target's `device`); () = it places its own

    @property
    def rank_splits(self) -> bool:
        """Split layouts are per-rank programs compiled in rank workers (inner cfg splits need these)."""
        return self.split_programs and not self.spmd_splits

    def key_part(self, target: str | None) -> dict[str, Any]:
        """This backend's compiler flags for `target`, a named part of every cache key ({} without flags)."""
        return self.flags(target) if self.flags is not None and target else {}


def inductor_device(target: str) -> dict[str, Any]:
    """The inductor key's device part: {} for the CPU (so every CPU key is what it was before
    devices existed), {"device": NAME} for another: a program is compiled for one device."""
    from difflet.passes.targets import program_device

    device = program_device(target)
    return {"device": device} if device not in (None, "cpu") else {}


BACKENDS: dict[str, BackendFacts] = {
    "inductor": BackendFacts("inductor", compiler="torch", split_programs=True, parallel_compiles=True,
                             shape_buckets=True, block_programs=True, flags=inductor_device,
                             devices=("cpu", "cuda")),
    "neuron": BackendFacts("neuron", compiler="neuronx-cc", toolchain=("torch-neuronx", "neuronx-distributed"),
                           split_programs=True, spmd_splits=True,
                           flags=neuron_flags.key_part, attention="nki"),
}


def backend_facts(name: str) -> BackendFacts:
    """The declaration of backend `name`; DiffletError for an unknown one."""
    if name not in BACKENDS:
        raise DiffletError(f"unknown backend {name!r} (choose one of: {', '.join(BACKENDS)})", where="--backend")
    return BACKENDS[name]


def names_with(capability: str) -> list[str]:
    """The backends that have `capability` (a BackendFacts field or property), in BACKENDS order."""
    return [b.name for b in BACKENDS.values() if getattr(b, capability)]
