"""cfg-branch: give the denoiser of a CFG-parallel plan the inputs of its unconditional pass.

Under `cfg2` one program call runs both guidance passes (rank group 0 the conditional one, group
1 the unconditional one), so the program takes both passes' inputs and returns both predictions.

Invariants:
- Only a component whose layout has cfg > 1 changes; every other module is returned unchanged.
- Which inputs differ between the passes is class data (split_rules `cfg_branch`, e.g. the text
  embeddings and the valid-text count); a class without it is left unchanged, and
  passes/built.py reads that as "not built" with the reason.
- For each branch input X (in the component's input order) an input `uncond_X` of the same type
  (a runtime input reads the same module runtime value and keeps its range) follows the last
  input; for each output Y an output `uncond_Y` of the same type follows the last output. Twins
  carry attrs `branch = "uncond"` and `twin = "X"`; the originals are the conditional pass's.
  Callers bind and read by IR name, so the call order is the printed order.
- Idempotent: existing twins are dropped first (a re-planned module gets the twins of its new
  layout, none under cfg 1).
"""
from __future__ import annotations

import msgspec

from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Node, Op, Value
from difflet.passes.layout_attrs import Layout, layout_node
from difflet.passes.split_rules import rules_for

PREFIX = "uncond_"


def branch_inputs(comp: Node) -> tuple[str, ...] | None:
    """The class's branch-dependent input names (None when the class declares none)."""
    rules = rules_for(comp.attrs.get("class", "")) or {}
    return rules.get("cfg_branch")


def cfg_degree(comp: Node) -> int:
    layout = layout_node(comp)
    return Layout.of(layout).cfg if layout is not None else 1


def has_twins(comp: Node) -> bool:
    return any(n.attrs.get("branch") == "uncond" for n in comp.body if n.op in (Op.INPUT, Op.OUTPUT))


def _twin(n: Node) -> Node:
    (value,) = n.results
    return msgspec.structs.replace(n, name=PREFIX + n.name, attrs=n.attrs.set(branch="uncond", twin=n.name),
                                   results=(Value(PREFIX + value.name, value.type),))


def add_uncond_branch(comp: Node) -> Node:
    """`comp` with the unconditional twins of its branch inputs and of every output."""
    names = branch_inputs(comp)
    if has_twins(comp):  # a re-planned module: start from the single-pass component
        comp = msgspec.structs.replace(comp, body=tuple(n for n in comp.body if n.attrs.get("branch") != "uncond"))
    if cfg_degree(comp) == 1 or names is None:
        return comp
    inputs = {n.name: n for n in comp.find(Op.INPUT)}
    missing = [x for x in names if x not in inputs]
    if missing:
        raise DiffletError(f"component {comp.name!r}: cfg branch inputs {missing} are not inputs of "
                           f"{comp.attrs.get('class')} (it has {sorted(inputs)})", where=comp.loc)
    twins_in = [_twin(n) for n in comp.find(Op.INPUT) if n.name in names]
    twins_out = [_twin(n) for n in comp.find(Op.OUTPUT)]
    last_in = max(i for i, n in enumerate(comp.body) if n.op == Op.INPUT)
    last_out = max(i for i, n in enumerate(comp.body) if n.op == Op.OUTPUT)
    body = []
    for i, n in enumerate(comp.body):
        body.append(n)
        body += twins_in if i == last_in else twins_out if i == last_out else []
    return msgspec.structs.replace(comp, body=tuple(body))


def add_cfg_branches(module: Module) -> Module:
    """The module with every cfg-planned component given its unconditional twins."""
    body = tuple(add_uncond_branch(n) if n.op == Op.COMPONENT else n for n in module.body)
    return msgspec.structs.replace(module, body=body)


def cond_view(comp: Node) -> Node:
    """The component as one guidance pass sees it: twins dropped, the layout's cfg axis folded
    away (cfg 1, world / cfg, placed on ranks / cfg as plan-parallel places that inner layout),
    i.e. the inner layout's component, node for node the one planned without cfg (the cache key
    attr aside: passes/cache_key.py `keyed` recomputes it)."""
    from difflet.passes.plan_parallel import placement_groups

    cfg = cfg_degree(comp)
    body = []
    for n in comp.body:
        if n.attrs.get("branch") == "uncond":
            continue
        if n.op == Op.LAYOUT and cfg > 1:
            la = Layout.of(n)
            inner = msgspec.structs.replace(la.config(), cfg=1)
            cores = len(la.ranks) // cfg
            n = msgspec.structs.replace(n, attrs=n.attrs.set(
                cfg=1, world=la.world // cfg, ranks=tuple(range(cores)),
                replicas=max(1, cores // inner.world), groups=placement_groups(inner, cores)))
        body.append(n)
    return msgspec.structs.replace(comp, body=tuple(body))
