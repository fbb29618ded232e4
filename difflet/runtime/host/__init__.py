"""Host steps: the functions a module's `schedule` node names, registered by name per family.

Invariants:
- A step is `fn(env: HostEnv, step: Node, state: RequestState) -> None`; it reads and writes
  only `state` (fresh per request) and calls compiled programs through `env.invoke`.
- Names are `<family>.<step>` (e.g. `flux.denoise`), exactly as the IR's `step` nodes spell them.
- Each step declares the timing phase it counts toward (`encode`, `denoise`, `decode`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

PHASES = ("encode", "denoise", "decode")


@dataclass(frozen=True)
class HostStep:
    name: str
    phase: str
    fn: Callable


_REGISTRY: dict[str, HostStep] = {}

# family name -> module that registers its steps on import
FAMILY_MODULES = {family: f"difflet.runtime.host.{family}"
                  for family in ("flux", "qwen_image", "wan", "hunyuan_video", "ltx2")}


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


def load_family(family: str) -> None:
    """Import the module holding `family`'s steps (registration happens on import)."""
    from difflet.errors import DiffletError

    module = FAMILY_MODULES.get(family)
    if module is None:
        raise DiffletError(f"no host steps for model family {family!r} "
                           f"(known: {', '.join(sorted(FAMILY_MODULES))})", where="family")
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module:
            raise
        raise DiffletError(f"model family {family!r} has no host steps yet ({module} is missing)",
                           where="family") from None


def get_step(name: str) -> HostStep:
    from difflet.errors import DiffletError

    family = name.split(".", 1)[0]
    if family in FAMILY_MODULES:
        load_family(family)
    if name not in _REGISTRY:
        raise DiffletError(f"the schedule names host step {name!r}, which is not registered "
                           f"(registered: {', '.join(sorted(_REGISTRY)) or 'none'})", where="schedule")
    return _REGISTRY[name]


def registered() -> list[str]:
    return sorted(_REGISTRY)
