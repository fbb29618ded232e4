"""The schedule executor: runs the IR's `schedule` node, step by step, over one request's state.

Invariants:
- `HostEnv` holds only what is the same for every request (module, programs, host assets such as
  tokenizers); `RequestState` is created fresh for each request and dropped after it, so no
  sampling state (generator, scheduler, latents) ever crosses requests.
- Steps run in the IR's order; each step's wall time is added to its phase's timing.
- Programs are called by component name through `HostEnv.invoke`, which binds by IR signature;
  a program runs one call at a time (its lock), and while a request is in a denoise-phase step
  its calls of a batched component go through the size's `BatchGate` (runtime/batching.py).
"""
from __future__ import annotations

import importlib
import time
from contextlib import nullcontext
from typing import Any, Callable, Mapping

from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Node, Op
from difflet.runtime.host import HostStep, registered, registry
from difflet.runtime.host.env import GenerateParams, HostEnv, RequestState


def host_module(family: str) -> str:
    """The import name of `family`'s host steps (a clear error for a family not registered)."""
    from difflet.families import FAMILIES, module_name

    if family not in FAMILIES:
        raise DiffletError(f"no host steps for model family {family!r} "
                           f"(known: {', '.join(sorted(FAMILIES))})", where="family")
    return module_name(family, "host")


def load_family(family: str) -> None:
    """Import the module holding `family`'s steps (registration happens on import)."""
    importlib.import_module(host_module(family))


def get_step(name: str) -> HostStep:
    """The host step `name` (`<family>.<step>`), importing its family's steps first."""
    from difflet.families import FAMILIES

    family = name.split(".", 1)[0]
    if family in FAMILIES:
        load_family(family)
    if name not in registry():
        raise DiffletError(f"the schedule names host step {name!r}, which is not registered "
                           f"(registered: {', '.join(registered()) or 'none'})", where="schedule")
    return registry()[name]




def schedule_steps(module: Module) -> tuple[Node, ...]:
    found = module.find(Op.SCHEDULE)
    if len(found) != 1:
        raise DiffletError(f"module {module.name!r} has {len(found)} schedule nodes, needs 1",
                           where=module.loc)
    return tuple(n for n in found[0].body if n.op == Op.STEP)


def check_schedule(module: Module, programs: Mapping[str, Callable]) -> None:
    """Every step is a registered host function and every component it calls has a program."""
    load_family(str(module.attrs.get("family", "")))
    for step in schedule_steps(module):
        get_step(step.name)
        for comp in step.args:
            if comp not in programs:
                raise DiffletError(f"step {step.name!r} calls component {comp!r}, which has no "
                                   f"program (have: {', '.join(sorted(programs))})", where=step.loc)


def run_schedule(env: HostEnv, params: GenerateParams, hooks: Any = None) -> RequestState:
    """Run every schedule step for one request on fresh state; returns that state.

    `hooks` (a stepcache.plan.StepHooks) is checked before every step and handed to the steps
    through the state, so cancellation and progress reach the denoise loop.
    """
    state = RequestState(params)
    if hooks is not None:
        state.values["step_hooks"] = hooks
    for step in schedule_steps(env.module):
        if hooks is not None:
            hooks.before_step()
        host = get_step(step.name)
        start = time.perf_counter()
        with env.gate.member() if env.gate is not None and host.phase == "denoise" else nullcontext():
            host.fn(env, step, state)
        state.timings[host.phase] += (time.perf_counter() - start) * 1000.0
    if (state.image is None) == (state.video is None):
        raise DiffletError("the schedule must produce exactly one of an image or a video",
                           where="schedule")
    return state
