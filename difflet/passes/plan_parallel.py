"""plan-parallel: give every component a complete `layout` node (the only layout truth codegen reads).

Invariants of a layout node (op layout, name "layout", one per component, last in its body):
- attrs: tp, cp, cfg, dp, sp, attention, world (this component's own degrees; encoders and
  decoders have only their own tp: given, 1, or raised by component_tp.resolve when they do
  not fit replicated; replicated over the rest of the same cores), ranks (global
  ranks holding it), groups (Attrs axis -> tuple of rank tuples; tp innermost, then cp, cfg,
  dp), tokens / local_tokens (per stream; CP shards only the visual stream, text and audio
  are replicated), joint_order (denoisers: [visual, text_valid, text_pad], so the valid text
  keys are the contiguous interval after the visual keys), sp_regions.
- body: `split` nodes (name = module-path glob; attrs style column|row, dim, group, degree,
  segments), `attention` nodes (name = site glob; attrs mode, heads_local, q_len, kv_len,
  calls, mask), and every `collective` (attrs kind, group, site, at, tensor, dim).
"""
from __future__ import annotations

import math
from typing import Mapping

import msgspec

from difflet.ir.nodes import Attrs, Module, Node, Op
from difflet.passes import cp_modes
from difflet.passes import model_facts as F
from difflet.passes.layout_attrs import Site
from difflet.passes.parallel_config import AXES, ParallelConfig
from difflet.passes.split_rules import rules_for

JOINT_ORDER = ("visual", "text_valid", "text_pad")


def component_config(comp: Node, model: ParallelConfig, component_tp: Mapping[str, int]) -> ParallelConfig:
    """The denoiser takes the model config; others (probe too) keep their own tp (default 1)."""
    if comp.attrs.get("role") == "denoiser":
        return model
    return ParallelConfig(tp=int(component_tp.get(comp.name, 1)))


def placement_groups(pc: ParallelConfig, world: int) -> Attrs:
    """Groups over all `world` cores; a smaller component is replicated over the rest."""
    reps = world // pc.world if pc.world and world % pc.world == 0 else 1
    out = {}
    for axis in reversed(AXES):
        base = pc.groups(axis)
        out[axis] = tuple(tuple(r + k * pc.world for r in g) for k in range(reps) for g in base)
    return Attrs(out)


def _splits(comp: Node, pc: ParallelConfig) -> list[Node]:
    if pc.tp == 1:
        return []
    rules = rules_for(comp.attrs.get("class", "")) or {}
    nodes = [Node(Op.SPLIT, g, Attrs(style="column", dim=0, group="tp", degree=pc.tp, bias="split"))
             for g in rules.get("column", ())]
    nodes += [Node(Op.SPLIT, g, Attrs(style="row", dim=1, group="tp", degree=pc.tp, bias="after_reduce"))
              for g in rules.get("row", ())]
    nodes += [Node(Op.SPLIT, g, Attrs(style="column", dim=0, group="tp", degree=pc.tp, bias="split"))
              for g in rules.get("column_gather", ())]
    hidden, mlp = F.hidden_size(comp), F.mlp_hidden(comp)
    sizes = {"attn": hidden, "mlp": mlp}
    for g, parts in rules.get("row_segments", {}).items():
        nodes.append(Node(Op.SPLIT, g, Attrs(style="row", dim=1, group="tp", degree=pc.tp,
                                             bias="after_reduce", segments=tuple(sizes[p] for p in parts))))
    return nodes


def _coll(kind: str, group: str, site: str, at: str, tensor: str, dim: int | None = None) -> Node:
    return Node(Op.COLLECTIVE, f"{site}@{at}:{kind}",
                Attrs(kind=kind, group=group, site=site, at=at, tensor=tensor, dim=dim))


def _tp_collectives(comp: Node, pc: ParallelConfig) -> list[Node]:
    """Megatron: all-reduce after every row linear; with SP reduce-scatter there and all-gather
    (sequence dim 1) before every column linear, so norm/modulation/residual run on 1/tp tokens."""
    if pc.tp == 1:
        return []
    rules = rules_for(comp.attrs.get("class", "")) or {}
    rows = tuple(rules.get("row", ())) + tuple(rules.get("row_segments", {}))
    out = []
    if pc.sp:
        out += [_coll("all_gather", "tp", g, "before", "activations", 1) for g in rules.get("column", ())]
        out += [_coll("reduce_scatter", "tp", g, "after", "activations", 1) for g in rows]
    else:
        out += [_coll("all_reduce", "tp", g, "after", "activations") for g in rows]
    out += [_coll("all_gather", "tp", g, "after", "modulation", -1) for g in rules.get("column_gather", ())]
    if rules.get("heads_norm_across"):
        for site in F.attention_sites(comp):
            for qk in ("norm_q", "norm_k"):
                out.append(_coll("all_reduce", "tp", f"{site.name}.{qk}", "inside", "sum_of_squares"))
    return out


def _site(comp: Node, site: Node, pc: ParallelConfig, local: dict[str, int]) -> tuple[Node, list[Node]]:
    """One attention site's per-rank shapes and the collectives its CP mode (cp_modes) needs."""
    decl = Site.of(site)
    q_s, k_s = decl.streams
    full = F.tokens(comp)
    lengths = {"full": {"joint": full["visual"] + full["text"], **full},
               "local": {"joint": local["visual"] + local["text"], **local},
               "shard": {k_s: local["visual"]}}
    mode = cp_modes.site_mode(pc.attention, pc.cp, q_s, k_s)
    colls = [_coll(x.kind, "cp", site.name, x.at, x.tensor, x.dim) for x in mode.exchanges
             if q_s == "joint" or not x.joint_only]
    calls: tuple = ()
    if mode.per_shard_calls:
        calls = tuple(f"visual[{i}]" for i in range(pc.cp)) + (("text[0:valid)",) if q_s == "joint" else ())
    attrs = Attrs(mode=mode.name, query=q_s, key=k_s, heads=decl.heads,
                  heads_local=decl.heads // math.prod(pc.degree(a) for a in mode.heads_axes),
                  head_dim=decl.head_dim, q_len=lengths[mode.queries][q_s], kv_len=lengths[mode.keys][k_s],
                  calls=calls, mask="text_valid" if decl.text_mask else "none", valid=decl.valid)
    return Node(Op.ATTENTION, site.name, attrs, loc=site.loc), colls


def layout_for(module: Module, comp: Node, pc: ParallelConfig, world: int) -> Node:
    full = F.tokens(comp)
    local = dict(full)
    is_den = comp.attrs.get("role") == "denoiser"
    if is_den and pc.cp > 1:
        local["visual"] = full["visual"] // pc.cp
    body: list[Node] = _splits(comp, pc) + _tp_collectives(comp, pc)
    sites = []
    if is_den:
        for site in F.attention_sites(comp):
            node, colls = _site(comp, site, pc, local)
            sites.append(node)
            body += colls
        if pc.cp > 1:
            body.append(_coll("all_gather", "cp", "proj_out", "after", "output visual tokens", 1))
    sp_local = {k: v // pc.tp for k, v in local.items()} if pc.sp else local
    attrs = Attrs(
        tp=pc.tp, cp=pc.cp, cfg=pc.cfg, dp=pc.dp, sp=pc.sp, attention=pc.attention, world=pc.world,
        ranks=tuple(range(world)), replicas=max(1, world // pc.world), groups=placement_groups(pc, world),
        tokens=Attrs(full), local_tokens=Attrs(local), sp_tokens=Attrs(sp_local),
        joint_order=JOINT_ORDER if is_den and any(Site.of(s).kind == "joint"
                                                  for s in F.attention_sites(comp)) else (),
        sp_regions=("norm", "modulation", "residual") if pc.sp else (),
    )
    return Node(Op.LAYOUT, "layout", attrs, body=tuple(sites + body), loc=comp.loc)


def plan_parallel(module: Module, config: ParallelConfig,
                  component_tp: Mapping[str, int] | None = None, auto: tuple[str, ...] = ()) -> Module:
    """Add (or replace) each component's layout; record in module attrs the model config,
    `component_tp` (every encoder/decoder's own tp) and `component_tp_auto` (the names whose
    tp component_tp.resolve raised because they did not fit replicated)."""
    ctp = dict(component_tp or {})
    body = []
    for node in module.body:
        if node.op == Op.COMPONENT:
            pc = component_config(node, config, ctp)
            kept = tuple(n for n in node.body if n.op != Op.LAYOUT)
            node = _replace(node, body=kept + (layout_for(module, node, pc, config.world),))
        body.append(node)
    own = {n.name: int(ctp.get(n.name, 1)) for n in module.body
           if n.op == Op.COMPONENT and n.attrs.get("role") != "denoiser"}
    attrs = module.attrs.set(parallel=config.to_attrs(), component_tp=Attrs(own),
                             component_tp_auto=tuple(auto))
    return Module(module.name, "planned", attrs, tuple(body), module.loc)


def _replace(node: Node, **changes) -> Node:
    return msgspec.structs.replace(node, **changes)
