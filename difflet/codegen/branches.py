"""Branch programs: one program per value of a runtime input, for targets without control flow.

A class may branch on a small-range runtime input inside its program (Wan's chunk decoder:
`torch.cond` on `first`). Where the target table says `control_flow: false` (trn2: neuronx-cc
implements no control flow), codegen instead compiles the component once per value of that
input, with the value fixed at build (the family wrapper reads `node.attrs["branch"]`) and the
input left out of the program's signature; the host calls the program of the value it passes.

Invariants:
- Which inputs a class branches on is declared once, beside its family (`ClassDecl.branch_inputs`);
  whether to split them into programs is the target table's `control_flow` (default true), and
  also on a torch older than COND_TORCH, whose export cannot trace them inside torch.cond.
- A branch view is the component without the branch input and with `attrs.branch = {name: value}`
  and its own cache key `branch_key(cache_key, name, value)`: each branch program is
  content-addressed on its own, and the component's key still identifies the set.
- `BranchRunner` keeps the Program call convention (every IR input, the branch input included):
  callers cannot tell a branch set from one program.
- At most MAX_BRANCHES values: a wider runtime range would be a program per request, not a branch.
"""
from __future__ import annotations

import hashlib
from typing import Callable, Mapping

import msgspec

from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Node, Op, RuntimeType

MAX_BRANCHES = 4


# the first torch whose export traces Wan's decoder inside torch.cond: 2.11's Dynamo stops at
# diffusers' `feat_cache[idx] == "Rep"` (a tensor's __eq__ with a str returns NotImplemented)
COND_TORCH = (2, 13)


def torch_traces_cond() -> bool:
    """Whether the installed torch exports the declared branching classes as one torch.cond program."""
    import torch

    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= COND_TORCH


def target_control_flow(module: Module) -> bool:
    """Whether codegen builds data-dependent control flow for the module's target: its table's
    `control_flow` and, for torch.cond, a torch that exports it (`torch_traces_cond`; the torch
    version is part of every cache key, so the choice never mixes programs)."""
    from difflet.passes.targets import load_target

    return bool(load_target(str(module.attrs.get("target", "cpu"))).get("control_flow", True)) \
        and torch_traces_cond()


def branch_key(cache_key: str, name: str, value: int) -> str:
    """The store key of the branch program for `name` = `value` (hex, like every store key)."""
    return hashlib.sha256(f"{cache_key}:branch:{name}={value}".encode()).hexdigest()


def branch_input(comp: Node) -> str | None:
    """The runtime input `comp`'s class declares it branches on, if its IR has it; at most one."""
    from difflet.codegen.declarations import declaration

    declared = declaration(str(comp.attrs.get("class"))).branch_inputs
    names = [n.name for n in comp.find(Op.INPUT) if n.name in declared]
    if len(names) > 1:
        raise DiffletError(f"component {comp.name!r} branches on {names}; branch programs are built for "
                           "one runtime input", where=comp.loc)
    return names[0] if names else None


def branch_values(comp: Node, name: str) -> list[int]:
    """Every value of the runtime input `name`, checked to be a runtime value of small range."""
    node = comp.find(Op.INPUT, name)[0]
    rtype = node.results[0].type
    if not isinstance(rtype, RuntimeType) or rtype.hi - rtype.lo + 1 > MAX_BRANCHES:
        raise DiffletError(f"component {comp.name!r} input {name!r} must be a runtime value with at most "
                           f"{MAX_BRANCHES} values to become branch programs, got {rtype}", where=node.loc)
    return list(range(rtype.lo, rtype.hi + 1))


def branch_view(comp: Node, name: str, value: int) -> Node:
    """`comp` as the program compiled for `name` = `value` sees it (see module invariants)."""
    body = tuple(n for n in comp.body if not (n.op == Op.INPUT and n.name == name))
    attrs = comp.attrs.set(branch={name: value}, cache_key=branch_key(comp.attrs["cache_key"], name, value)) \
        if comp.attrs.get("cache_key") else comp.attrs.set(branch={name: value})
    return msgspec.structs.replace(comp, body=body, attrs=attrs)


def branch_views(comp: Node, control_flow: bool) -> list[tuple[int, Node]]:
    """(value, view) per branch program of `comp` for a target with(out) `control_flow`; [] = one program."""
    if comp.op != Op.COMPONENT or control_flow:
        return []
    name = branch_input(comp)
    return [] if name is None else [(v, branch_view(comp, name, v)) for v in branch_values(comp, name)]


def branch_label(node: Node) -> str:
    """The node's name, with the fixed value of a branch view: `vae (first=1)`."""
    branch = node.attrs.get("branch")
    return node.name + (f" ({', '.join(f'{k}={v}' for k, v in branch.items())})" if branch else "")


class BranchRunner:
    """Runs the branch program of the value at input `index`; takes every IR input (that one too)."""

    def __init__(self, index: int, runners: Mapping[int, Callable[..., tuple]]) -> None:
        self.index, self.runners = index, dict(runners)

    def __call__(self, *tensors):
        value = int(tensors[self.index])
        if value not in self.runners:
            raise ValueError(f"no branch program for value {value} (compiled: {sorted(self.runners)})")
        return self.runners[value](*tensors[:self.index], *tensors[self.index + 1:])
