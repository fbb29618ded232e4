"""Enumerate every parallel configuration of N cores and judge each (`difflet opt --list-legal`).

Invariant: a row is judged by exactly the passes `optimize` runs before compiling
(plan-parallel, extract-probe, legality), so the table and `optimize` never disagree.
"""
from __future__ import annotations

from dataclasses import dataclass

from difflet.ir.nodes import Module
from difflet.passes import legality, memory
from difflet.passes.extract_probe import extract_probe
from difflet.passes.parallel_config import ParallelConfig, enumerate_configs
from difflet.passes.plan_parallel import plan_parallel
from difflet.passes.targets import load_target


@dataclass(frozen=True)
class Row:
    config: ParallelConfig
    memory_gib: float
    violations: tuple[legality.Violation, ...]

    @property
    def legal(self) -> bool:
        return not self.violations


def judge(m: Module, opts, config: ParallelConfig) -> Row:
    target = load_target(opts.target)
    planned = extract_probe(plan_parallel(m, config, opts.component_tp), opts.probe)
    found = legality.check(planned, target, opts.backend, config.world)
    return Row(config, memory.estimate(planned, target).total / memory.GIB, tuple(found))


def rows(m: Module, opts, cores: int) -> list[Row]:
    return [judge(m, opts, c) for c in enumerate_configs(cores)]


def legal_labels(m: Module, opts) -> list[str]:
    return [r.config.label() for r in rows(m, opts, opts.parallel.world) if r.legal]


def table(m: Module, opts, cores: int) -> str:
    """A markdown table: config | est. memory per core | verdict (the first rule that rejects)."""
    target = load_target(opts.target)
    out = [f"| config | memory/core (of {target['memory_per_core_gib']} GiB) | verdict |",
           "|---|---|---|"]
    for r in rows(m, opts, cores):
        v = "legal" if r.legal else f"{r.violations[0].rule}: {r.violations[0].message.splitlines()[0]}"
        out.append(f"| {r.config.label()} | {r.memory_gib:.1f} GiB | {v} |")
    return "\n".join(out)


__all__ = ["Row", "judge", "rows", "legal_labels", "table"]
