"""Enumerate every parallel configuration of N cores and judge each (`difflet opt --list-legal`).

Invariant: a row is judged by exactly the passes `optimize` runs before compiling
(component_tp.resolve + plan-parallel, extract-probe, cfg-branch, legality), so the table and `optimize`
never disagree; each row also carries every encoder/decoder's tp and which were raised, and
what codegen would refuse of a legal plan (difflet/passes/built.py): such a row reads
"not-built", never "legal".
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from difflet.ir.nodes import Module
from difflet.passes import built, component_tp, legality, memory
from difflet.passes.cfg_branch import add_cfg_branches
from difflet.passes.extract_probe import extract_probe
from difflet.passes.parallel_config import ParallelConfig, enumerate_configs
from difflet.passes.plan_parallel import plan_parallel
from difflet.passes.targets import load_target


@dataclass(frozen=True)
class Row:
    config: ParallelConfig
    memory_gib: float
    violations: tuple[legality.Violation, ...]
    component_tp: tuple[tuple[str, int], ...] = ()   # every encoder/decoder's own tp
    auto: tuple[str, ...] = ()                       # those raised by component_tp.resolve
    unbuilt: tuple[tuple[str, str], ...] = ()        # (component, reason) codegen would refuse

    def components(self) -> str:
        """The encoders/decoders not at tp1, e.g. `text_encoder tp2 (auto)`; `all tp1` if none."""
        parts = [f"{n} tp{d}" + (" (auto)" if n in self.auto else "")
                 for n, d in self.component_tp if d != 1]
        return ", ".join(parts) or "all tp1"

    @property
    def legal(self) -> bool:
        """The planner accepts it (what `difflet opt` checks)."""
        return not self.violations

    @property
    def buildable(self) -> bool:
        """Legal and built by codegen: what --list-legal calls "legal"."""
        return self.legal and not self.unbuilt


def judge(m: Module, opts, config: ParallelConfig) -> Row:
    target = load_target(opts.target)
    ctp, auto = component_tp.resolve(m, config, opts.component_tp, target, opts.probe)
    planned = add_cfg_branches(extract_probe(plan_parallel(m, config, ctp, auto), opts.probe))
    found = legality.check(planned, target, opts.backend, config.world)
    return Row(config, memory.estimate(planned, target).total / memory.GIB, tuple(found),
               tuple(ctp.items()), auto, tuple(built.reasons(planned, opts.backend)))


def rows(m: Module, opts, cores: int) -> list[Row]:
    return [judge(m, opts, c) for c in enumerate_configs(cores)]


def legal_labels(m: Module, opts) -> list[str]:
    """Configurations the planner accepts (built or not: an illegal plan's alternatives)."""
    return [r.config.label() for r in rows(m, opts, opts.parallel.world) if r.legal]


def table(m: Module, opts, cores: int) -> str:
    """A markdown table: config | est. memory per core | encoder/decoder tp | verdict (the first
    rule that rejects, with the component it names), each configuration judged without the
    step-caching probe and with it (`--probe`, default separate: its weights and saved feature
    count in memory). A with-probe verdict equal to the one without reads `same`."""
    target = load_target(opts.target)
    no_probe = replace(opts, probe="none")
    with_probe = replace(opts, probe=opts.probe if opts.probe != "none" else "separate")
    out = [f"| config | memory/core (of {target['memory_per_core_gib']} GiB) | encoders/decoders | verdict "
           f"| + probe ({with_probe.probe}): memory/core | + probe: verdict |", "|---|---|---|---|---|---|"]
    for r, p in zip(rows(m, no_probe, cores), rows(m, with_probe, cores), strict=True):
        pv = verdict(p)
        if p.components() != r.components():  # the probe raised an encoder's own tp
            pv += f" [{p.components()}]"
        out.append(f"| {r.config.label()} | {r.memory_gib:.1f} GiB | {r.components()} | {verdict(r)} "
                   f"| {p.memory_gib:.1f} GiB | {'same' if pv == verdict(r) else pv} |")
    return "\n".join(out)


def verdict(r: Row) -> str:
    """`legal`, the first violation's rule, component and first message line, or `not-built`
    with the component and why codegen refuses it."""
    if r.buildable:
        return "legal"
    if r.legal:
        comp, reason = r.unbuilt[0]
        return f"not-built ({comp}): {reason}"
    v = r.violations[0]
    where = f" ({v.component})" if v.component else ""
    return f"{v.rule}{where}: {v.message.splitlines()[0]}"


__all__ = ["Row", "judge", "rows", "legal_labels", "table", "verdict"]
