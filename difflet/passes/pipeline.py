"""`optimize`: the pass pipeline from pipeline-level to planned-level IR, as a plain list.

Invariants:
- PASSES is the readable, ordered list of named passes; each is `(Module, Options) -> Module`.
  extract-probe runs before legality so the memory rule counts the probe; cfg-branch after it
  (the probe watches the conditional pass) and before cache-key (the twins are program inputs).
- Nothing here compiles or imports torch; an illegal plan raises DiffletError (naming the
  rule, component and DSL location, plus the legal configurations) before any compile.
- The result has level "planned", attrs parallel/target/backend/compiler/difflet_version,
  and every component has a layout node and attrs["cache_key"] (hex sha256).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import msgspec

from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Op
from difflet.ir.verify import verify
from difflet.passes import cache_key, component_tp, legality
from difflet.passes.cfg_branch import add_cfg_branches
from difflet.passes import model_facts as F
from difflet.passes.extract_probe import extract_probe
from difflet.passes.front_blocks import cut_front
from difflet.passes.parallel_config import ParallelConfig, parse_parallel
from difflet.passes.plan_parallel import plan_parallel
from difflet.passes.targets import load_target


@dataclass(frozen=True)
class Options:
    parallel: ParallelConfig
    target: str = "cpu"
    backend: str = "inductor"
    compiler_version: str = ""
    difflet_version: str | None = None  # None = the installed Difflet (+ program-source digest)
    probe: str = "none"
    cores: int | None = None
    component_tp: Mapping[str, int] = field(default_factory=dict)
    front_blocks: int = 0  # block mode: the denoiser's first K blocks as their own program (0: whole)


def _plan(m: Module, o: Options) -> Module:
    if m.level != "pipeline" and m.level != "planned":
        raise DiffletError(f"difflet opt takes pipeline-level IR, got level {m.level!r}",
                           where=m.attrs.get("source", m.name))
    # encoders/decoders that do not fit replicated beside the denoiser get their own tp
    ctp, auto = component_tp.resolve(m, o.parallel, o.component_tp, load_target(o.target), o.probe)
    planned = plan_parallel(m, o.parallel, ctp, auto)
    return msgspec.structs.replace(planned, attrs=planned.attrs.set(target=o.target))


def _probe(m: Module, o: Options) -> Module:
    return extract_probe(m, o.probe)


def _cfg_branch(m: Module, o: Options) -> Module:
    return add_cfg_branches(m)


def _front_blocks(m: Module, o: Options) -> Module:
    return cut_front(m, o.front_blocks, o.backend)


def _legality(m: Module, o: Options) -> Module:
    target = load_target(o.target)
    found = legality.check(m, target, o.backend, o.cores)
    if found:
        from difflet.passes.legal_configs import legal_labels

        v = found[0]
        where = v.loc if v.loc.line else m.attrs.get("source", m.name)
        comp = f", component {v.component}" if v.component else ""
        legal, given = legal_labels(m, o), ""
        if not legal and o.component_tp:
            # the override itself may be what no configuration survives: show what would
            legal, given = legal_labels(m, replace(o, component_tp={})), " without --component-tp"
        shown = ", ".join(legal[:8]) + (f", ... ({len(legal)} in all; see --list-legal)" if len(legal) > 8 else "")
        hint = f"legal on {o.target} with {o.parallel.world} cores{given}: {shown}" if legal else \
            f"no configuration of {o.parallel.world} cores is legal on {o.target}"
        first, _, rest = v.message.partition("\n")   # the memory breakdown goes after the verdict
        raise DiffletError(f"illegal plan {o.parallel.label()} on {o.target}: {first} "
                           f"(rule {v.rule}{comp}); {hint}" + (f"\n{rest}" if rest else ""), where=where)
    return m


def _cache_key(m: Module, o: Options) -> Module:
    return cache_key.assign_cache_keys(m, o.backend, o.compiler_version, o.difflet_version)


def _verify(m: Module, o: Options) -> Module:
    for comp in F.compiled(m):
        if len(comp.find(Op.LAYOUT)) != 1 or "cache_key" not in comp.attrs:
            raise DiffletError(f"internal: component {comp.name} lacks its layout or cache key",
                               where=comp.loc)
    verify(m)
    return m


PASSES: list[tuple[str, Callable[[Module, Options], Module]]] = [
    ("plan-parallel", _plan),
    ("extract-probe", _probe),
    ("cfg-branch", _cfg_branch),  # after extract-probe: the probe reads the conditional pass only
    ("front-blocks", _front_blocks),  # after plan-parallel: a split layout is refused
    ("legality", _legality),
    ("cache-key", _cache_key),
    ("verify", _verify),
]


def optimize(module: Module, parallel: str = "tp1", target: str = "cpu", backend: str | None = None,
             compiler_version: str | None = None, probe: str = "none", attention: str | None = None,
             cores: int | None = None, component_tp: Mapping[str, int] | None = None,
             passes: list[str] | None = None, difflet_version: str | None = None,
             front_blocks: int = 0) -> Module:
    """Run PASSES (or the named subset, in PASSES order) and return the planned module.

    backend None = the target's first backend; compiler_version None = read from the installed
    compiler package (torch for inductor, neuronx-cc for neuron) without importing it;
    difflet_version None = the installed version plus the program-source digest (golden tests pin it).
    """
    from difflet.ir.buckets import buckets, merge, views

    if buckets(module):  # each size is planned on its own; size-independent nodes plan identically
        return merge([optimize(v, parallel, target, backend, compiler_version, probe, attention, cores,
                               component_tp, passes, difflet_version, front_blocks)
                      for _, v in views(module)])
    table = load_target(target)
    backend = backend or table["backends"][0]
    opts = Options(parallel=parse_parallel(parallel, attention), target=target, backend=backend,
                   compiler_version=compiler_version or cache_key.compiler_version(backend),
                   difflet_version=difflet_version, probe=probe, cores=cores,
                   component_tp=dict(component_tp or {}), front_blocks=front_blocks)
    for name, run in PASSES:
        if passes is None or name in passes:
            module = run(module, opts)
    return module
