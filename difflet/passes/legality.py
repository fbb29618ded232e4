"""legality: check a planned module against a target table before anything compiles.

Invariants:
- Each rule is a named function (module, ctx) -> list[Violation]; RULES lists them in the
  order they are reported. Limits come only from the target table (targets.py), never from
  a per-target branch.
- A Violation names its rule, the component and the DSL location (`Loc` of the site or
  component), so `difflet opt` can print `file:line:col: ... (rule R)` and exit 2.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from difflet.ir.nodes import Loc, Module, Node, Op
from difflet.passes import memory
from difflet.passes import model_facts as F
from difflet.passes.cp_modes import MODES
from difflet.passes.layout_attrs import Layout, PlannedSite
from difflet.passes.split_rules import rules_for


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str
    component: str = ""
    loc: Loc = Loc.unknown()


@dataclass(frozen=True)
class Context:
    target: Mapping[str, Any]
    backend: str
    cores: int | None


def _model(m: Module) -> Layout:
    """The model configuration (module attr `parallel`: a layout's degrees)."""
    return Layout.of(m.attrs["parallel"])


def _layout(comp: Node) -> Layout:
    return Layout.of(comp.find(Op.LAYOUT)[0])


def _den_sites(m: Module):
    """(component, its Layout, a PlannedSite, the site's DSL location) of every denoiser site."""
    for comp in m.components("denoiser"):
        node = comp.find(Op.LAYOUT)[0]
        for site in node.find(Op.ATTENTION):
            yield comp, Layout.of(node), PlannedSite.of(site), site.loc


def backend(m: Module, ctx: Context) -> list[Violation]:
    if ctx.backend in ctx.target["backends"]:
        return []
    return [Violation("backend", f"backend {ctx.backend} cannot target {ctx.target['name']} "
                      f"(it supports {', '.join(ctx.target['backends'])})")]


def cores(m: Module, ctx: Context) -> list[Violation]:
    world = _model(m).world
    if ctx.cores is not None and world != ctx.cores:
        return [Violation("cores", f"world dp*cfg*cp*tp = {world} does not equal --cores {ctx.cores}")]
    if world > ctx.target["max_cores"]:
        return [Violation("cores", f"world {world} exceeds the {ctx.target['max_cores']} cores of "
                          f"{ctx.target['name']}")]
    return []


def split_rules(m: Module, ctx: Context) -> list[Violation]:
    out = []
    world = _model(m).world
    for comp in m.components():
        tp = _layout(comp).tp
        if tp > 1 and rules_for(comp.attrs.get("class", "")) is None:
            out.append(Violation("split-rules", f"no tensor-parallel split rules for class "
                                 f"{comp.attrs.get('class')}, so it cannot run tp{tp}", comp.name, comp.loc))
        if world % tp:
            out.append(Violation("component-tp", f"tp{tp} does not divide the {world} cores",
                                 comp.name, comp.loc))
    return out


def head_dim(m: Module, ctx: Context) -> list[Violation]:
    lim = ctx.target["max_head_dim"]
    return [Violation("head-dim", f"head_dim {s.head_dim} exceeds {lim} on {ctx.target['name']}",
                      c.name, loc) for c, _, s, loc in _den_sites(m) if s.head_dim > lim]


def tp_heads(m: Module, ctx: Context) -> list[Violation]:
    out = [Violation("tp-heads", f"heads {s.heads} not divisible by tp = {lay.tp}",
                     c.name, loc) for c, lay, s, loc in _den_sites(m) if s.heads % lay.tp]
    for comp in m.components():
        tp = _layout(comp).tp
        if tp == 1 or comp.attrs.get("role") == "denoiser":
            continue
        for key, n in F.head_counts(comp):
            if n % tp:
                out.append(Violation("tp-heads", f"{key} {n} not divisible by tp = {tp}",
                                     comp.name, comp.loc))
    return out


def cp_heads(m: Module, ctx: Context) -> list[Violation]:
    """A mode that divides heads over more than tp (cp_modes `heads_axes`) needs them to divide;
    the rule is named after the mode (`ulysses-heads`)."""
    out = []
    for c, lay, s, loc in _den_sites(m):
        axes = MODES[s.mode].heads_axes
        n = math.prod(lay.degree(a) for a in axes)
        if axes != ("tp",) and s.heads % n:
            out.append(Violation(f"{s.mode}-heads", f"heads {s.heads} not divisible by "
                                 f"{'*'.join(axes)} = {n}", c.name, loc))
    return out


def attention_mode(m: Module, ctx: Context) -> list[Violation]:
    mode = _model(m).attention
    if mode == "none" or mode in ctx.target["attention_modes"]:
        return []
    return [Violation("attention-mode", f"{ctx.target['name']} does not run {mode} attention")]


def token_split(m: Module, ctx: Context) -> list[Violation]:
    out = []
    for comp in m.components("denoiser"):
        lay = _layout(comp)
        cp, tp, full = lay.cp, lay.tp, lay.tokens
        if cp > 1 and full["visual"] % cp:
            out.append(Violation("cp-tokens", f"visual tokens {full['visual']} not divisible by cp = {cp}",
                                 comp.name, comp.loc))
        if lay.sp:
            for stream, n in lay.local_tokens.items():
                if n % tp:
                    out.append(Violation("sp-tokens", f"{stream} tokens {n} per rank not divisible "
                                         f"by tp = {tp} for sequence parallelism", comp.name, comp.loc))
    return out


def cfg_branches(m: Module, ctx: Context) -> list[Violation]:
    cfg = _model(m).cfg
    if cfg == 1:
        return []
    if F.guidance_branches(m) != 2:
        return [Violation("cfg", f"cfg{cfg} needs true classifier-free guidance (two passes); this "
                          "model's guidance runs in one pass")]
    if cfg != 2:
        return [Violation("cfg", f"cfg{cfg}: guidance has exactly 2 branches")]
    return []


def masked_fused_attention(m: Module, ctx: Context) -> list[Violation]:
    rules = ctx.target["fused_attention"]
    out = []
    for c, lay, s, loc in _den_sites(m):
        masked = s.mask != "none"
        one_call = MODES[s.mode].one_masked_call  # e.g. not ring: one call per visual shard
        if masked and rules["equal_qk_len_when_masked"] and one_call and s.q_len != s.kv_len:
            out.append(Violation("masked-equal-qk", f"{s.mode} gives {s.q_len} queries and "
                                 f"{s.kv_len} keys, but masked fused attention on "
                                 f"{ctx.target['name']} needs equal query and key lengths", c.name, loc))
        order = lay.joint_order
        if masked and rules["contiguous_valid_keys"] and order and order[-1] != "text_pad":
            out.append(Violation("contiguous-valid-keys", f"joint order {order} does not keep valid "
                                 "text keys contiguous", c.name, loc))
    return out


def memory_fits(m: Module, ctx: Context) -> list[Violation]:
    est = memory.estimate(m, ctx.target)
    if est.fits():
        return []
    # name the component holding the most bytes per core: the one to split further or shrink
    per: dict[str, int] = {}
    for name, _, n in est.items:
        per[name] = per.get(name, 0) + n
    names = {c.name: c for c in F.compiled(m)}
    top = max((k for k in per if k in names), key=lambda k: per[k], default="")
    loc = names[top].loc if top else Loc.unknown()
    return [Violation("memory", f"estimated {est.summary()} does not fit\n{est.breakdown()}", top, loc)]


RULES: tuple[Callable[[Module, Context], list[Violation]], ...] = (
    backend, cores, split_rules, head_dim, tp_heads, cp_heads, attention_mode, token_split,
    cfg_branches, masked_fused_attention, memory_fits,
)


def check(m: Module, target: Mapping[str, Any], backend_name: str, n_cores: int | None = None) -> list[Violation]:
    """Every violation of every rule, in RULES order (empty = legal)."""
    ctx = Context(target, backend_name, n_cores)
    return [v for rule in RULES for v in rule(m, ctx)]
