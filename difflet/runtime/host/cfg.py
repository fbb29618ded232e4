"""Both guidance passes of one denoising step, as one program call or two.

Invariants:
- A denoiser compiled under a cfg2 layout carries the unconditional pass's inputs and outputs as
  `uncond_*` twins (difflet/passes/cfg_branch.py; attrs branch="uncond", twin=<name>): one call
  runs both passes on their own rank groups and returns both predictions. Any other denoiser is
  called once per pass. Either way the caller gets the same (cond, uncond) outputs by IR name
  and applies its family's CFG formula itself, so sequential and CFG-parallel serving share it.
- The two passes' inputs differ only in the twinned names; any other difference is a host bug
  and raises (the program would silently run the unconditional pass on the conditional values).
- Without CFG (uncond None) a cfg2 program still needs its twins: the conditional values are
  fed to both groups and the unconditional outputs are dropped.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from difflet.ir.nodes import Node, Op
from difflet.runtime.host.env import HostEnv

PREFIX = "uncond_"  # passes/cfg_branch.py's twin prefix (the IR names are the contract)


def twins(node: Node, op: Op) -> dict[str, str]:
    """{original name: twin name} of a component's unconditional-branch inputs or outputs."""
    return {n.attrs["twin"]: n.name for n in node.find(op) if n.attrs.get("branch") == "uncond"}


def is_cfg_parallel(node: Node) -> bool:
    """Whether one call of this denoiser runs both guidance passes (a cfg2 layout's program)."""
    return bool(twins(node, Op.INPUT))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b or (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                          and a.shape == b.shape and torch.equal(a, b))
    return a == b


def predict_branches(env: HostEnv, component: str, cond: Mapping[str, Any],
                     uncond: Mapping[str, Any] | None) -> tuple[dict, dict | None]:
    """(conditional outputs, unconditional outputs or None) by IR output name."""
    node = env.component(component)
    ins = twins(node, Op.INPUT)
    if not ins:
        return env.invoke(component, **cond), (env.invoke(component, **uncond) if uncond is not None else None)
    other = uncond if uncond is not None else cond
    if set(other) != set(cond):
        raise ValueError(f"{component}: the passes' inputs differ in names: {sorted(set(other) ^ set(cond))}")
    differ = sorted(k for k in cond if k not in ins and not _same(cond[k], other[k]))
    if differ:
        raise ValueError(f"{component}: inputs {differ} differ between the guidance passes, but the cfg "
                         f"program takes only {sorted(ins)} per pass")
    out = env.invoke(component, **cond, **{twin: other[name] for name, twin in ins.items()})
    outs = twins(node, Op.OUTPUT)
    cond_out = {k: v for k, v in out.items() if k not in outs.values()}
    return cond_out, ({name: out[twin] for name, twin in outs.items()} if uncond is not None else None)
