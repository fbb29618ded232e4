"""The rank program of a CFG-parallel (cfg2) denoiser: each cfg group runs one guidance pass.

Invariants:
- world = cfg x inner (tp/cp) ranks, groups from `make_groups` (cfg outside cp and tp): cfg
  group 0 runs the conditional pass on the IR's original inputs, group 1 the unconditional pass
  on the same inputs with the `uncond_*` twins (difflet/passes/cfg_branch.py) in their place.
- Inside a group the program is exactly the inner layout's program (`cond_view`: twins dropped,
  cfg folded away): the unsplit program when the inner world is 1 (any class), else
  split_layout's tp/cp rank module over this rank's tp/cp groups. So weights are the inner
  program's, and rank r and r + inner hold the same shards.
- The groups' predictions meet in one all-gather over the cfg group (as xDiT's CFG parallel
  does); every rank returns (cond outputs..., uncond outputs...) in the IR's output order, the
  full tensors, so the program keeps the unsplit call convention. Combining them is the
  family's formula on the host (runtime/host/cfg.py), never inside the program.
"""
from __future__ import annotations

import os

import torch

from difflet.codegen.program import program_inputs
from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op
from difflet.passes.cfg_branch import cfg_degree, cond_view


class CfgRankModule(torch.nn.Module):
    """One rank of a cfg2 program: pick this group's pass, run the inner program, gather both."""

    def __init__(self, inner: torch.nn.Module, node: Node, groups) -> None:
        super().__init__()
        self.inner = inner
        self.cfg_group = groups.group("cfg")
        self.branch = groups.index("cfg")
        names = [v.name for v in program_inputs(node)]
        twin = {n.attrs["twin"]: n.name for n in node.find(Op.INPUT) if n.attrs.get("branch") == "uncond"}
        cond = [v.name for v in program_inputs(cond_view(node))]
        picked = cond if self.branch == 0 else [twin.get(n, n) for n in cond]
        self.index = [names.index(n) for n in picked]

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from difflet.parallel import comm

        outs = self.inner(*(inputs[i] for i in self.index))
        # dim 0 is the batch: rows [0, B) came from cfg group 0 (cond), [B, 2B) from group 1
        both = [comm.all_gather(y, 0, self.cfg_group).chunk(2, 0) for y in outs]
        return tuple(c for c, _ in both) + tuple(u for _, u in both)


def build_cfg_rank_module(node: Node, ckpt_dir: str | os.PathLike, groups) -> CfgRankModule:
    """This rank's cfg program module (groups: the full cfg x inner RankGroups, or static ones
    for weights only)."""
    from difflet.codegen.split_layout import build_rank_module, unsupported_reason

    if cfg_degree(node) != 2:
        raise DiffletError(f"component {node.name!r}: cfg{cfg_degree(node)} layouts are not built "
                           "(guidance has two passes)", where=node.loc)
    reason = unsupported_reason(node)
    if reason:
        raise DiffletError(f"component {node.name!r}: {reason}", where=node.loc)
    return CfgRankModule(build_rank_module(cond_view(node), ckpt_dir, groups), node, groups).eval()
