"""Host steps: the functions a module's `schedule` node names, registered by name per family.

Invariants:
- A step is `fn(env: HostEnv, step: Node, state: RequestState) -> None`; it reads and writes
  only `state` (fresh per request) and calls compiled programs through `env.invoke`.
- Names are `<family>.<step>`, exactly as the IR's `step` nodes spell them; a family's steps
  live in difflet/families/<family>/host.py, found through the family registry.
- Each step declares the timing phase it counts toward (`encode`, `denoise`, `decode`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

PHASES = ("encode", "denoise", "decode")


@dataclass(frozen=True)
class HostStep:
    name: str
    phase: str
    fn: Callable


_REGISTRY: dict[str, HostStep] = {}


def host_step(name: str, phase: str) -> Callable[[Callable], Callable]:
    """Register `fn` as the host step `name`; a second registration of one name is a bug."""
    if phase not in PHASES:
        raise ValueError(f"host step {name!r}: phase must be one of {PHASES}, not {phase!r}")

    def register(fn: Callable) -> Callable:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"host step {name!r} registered twice")
        _REGISTRY[name] = HostStep(name, phase, fn)
        return fn

    return register


def registry() -> dict[str, HostStep]:
    """Every step registered so far (read-only by convention), by name."""
    return _REGISTRY


def registered() -> list[str]:
    """The names of every step registered so far, sorted."""
    return sorted(_REGISTRY)
