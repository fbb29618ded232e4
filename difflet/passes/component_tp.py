"""Resolve each encoder's and decoder's own TP degree beside the denoiser (paper section 6).

Resident components share the same cores, but their TP degrees can differ: FLUX keeps its VAE
replicated (TP1) beside a TP4 denoiser. A component that does not fit replicated beside the
denoiser gets a TP degree of its own.

Invariants:
- The denoiser (and the probe) take the model's configuration; every other component starts
  at TP1. `--component-tp NAME=N` is taken as given, never changed here (legality judges it).
- Only when the whole plan does not fit in memory at these degrees is anything raised:
  components without a given degree are visited largest replicated weights first, and each
  gets the smallest power of two, up to the denoiser's TP, that makes the plan fit; if none
  does, it keeps the largest degree it may take and the next component is visited. So a plan
  that fits at TP1 is never changed, raising stops as soon as the plan fits, and a plan that
  fits at no degrees is judged at its smallest footprint (its memory figure is a lower bound).
- A degree is only tried where the component could run it: its class has split rules, the
  degree divides the cores, and its attention (and KV) head counts.
- Memory is judged by exactly the model legality uses (plan-parallel, extract-probe,
  memory.estimate), so the choice and the verdict never disagree.
"""
from __future__ import annotations

from typing import Any, Mapping

from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Node, Op
from difflet.passes import memory
from difflet.passes import model_facts as F
from difflet.passes.extract_probe import extract_probe
from difflet.passes.parallel_config import ParallelConfig
from difflet.passes.plan_parallel import plan_parallel
from difflet.passes.split_rules import rules_for


def can_run_tp(comp: Node, tp: int, world: int) -> bool:
    """Whether `comp` has split rules for tp > 1 and tp divides the cores and its head counts."""
    if tp == 1:
        return True
    if rules_for(comp.attrs.get("class", "")) is None or world % tp:
        return False
    return all(n % tp == 0 for _, n in F.head_counts(comp))


def _candidates(den_tp: int) -> list[int]:
    out, d = [], 2
    while d <= den_tp:
        out.append(d)
        d *= 2
    return out


def _fits(m: Module, config: ParallelConfig, tps: Mapping[str, int], target: Mapping[str, Any],
          probe: str) -> bool:
    planned = extract_probe(plan_parallel(m, config, tps), probe)
    return memory.estimate(planned, target).fits()


def resolve(m: Module, config: ParallelConfig, given: Mapping[str, int] | None,
            target: Mapping[str, Any] | None, probe: str = "none") -> tuple[dict[str, int], tuple[str, ...]]:
    """(tp of every encoder/decoder by name, names whose tp was raised automatically).

    With no target (no memory to judge) every component keeps its given degree or TP1.
    """
    given = dict(given or {})
    comps = [c for c in m.body if c.op == Op.COMPONENT and c.attrs.get("role") != "denoiser"]
    unknown = sorted(set(given) - {c.name for c in comps})
    if unknown:
        raise DiffletError(f"--component-tp names {', '.join(unknown)}, which is not an encoder or "
                           f"decoder of {m.name} (they are: {', '.join(c.name for c in comps)}; the "
                           "denoiser's tp comes from --parallel)", where="--component-tp",
                           snippet=unknown[0])
    tps = {c.name: int(given.get(c.name, 1)) for c in comps}
    if target is None or _fits(m, config, tps, target, probe):
        return tps, ()
    free = [c for c in comps if c.name not in given]
    free.sort(key=lambda c: -memory.weight_bytes(c, 1))
    raised: list[str] = []
    for comp in free:
        for d in _candidates(config.tp):
            if not can_run_tp(comp, d, config.world):
                continue
            tps[comp.name] = d
            if comp.name not in raised:
                raised.append(comp.name)
            if _fits(m, config, tps, target, probe):
                return tps, tuple(raised)
    return tps, tuple(raised)


__all__ = ["can_run_tp", "resolve"]
