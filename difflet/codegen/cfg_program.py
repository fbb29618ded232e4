"""A cfg2 denoiser's programs: the inner layout's programs, compiled once, run as two replicas.

Invariants:
- The program codegen compiles for a cfg2 component is its inner layout's (`inner_node`:
  passes/cfg_branch.py `cond_view`, keyed by passes/cache_key.py `keyed`), node and cache key
  equal to the same inner layout planned without cfg: a tp1+cfg2 artifact reuses the TP1
  denoiser's store entry, tp2+cfg2 the tp2 rank entries, and writes the same files (one
  program and weights file per inner rank, shared by both cfg groups).
- At load time the two cfg groups are two SplitPrograms of that inner program (world 1
  included), composed by parallel/cfg_program.py's CfgProgram: group g's rank r is global rank
  g x inner world + r (cfg outside cp and tp, as `make_groups` orders the axes).
"""
from __future__ import annotations

import os
from pathlib import Path

import msgspec

from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Node
from difflet.passes.cfg_branch import cfg_degree, cond_view


def inner_node(module: Module, node: Node) -> Node:
    """The inner program's component of cfg component `node` of keyed `module`, with its own key."""
    from difflet.passes.cache_key import keyed

    if cfg_degree(node) != 2:
        raise DiffletError(f"component {node.name!r}: cfg{cfg_degree(node)} layouts are not built "
                           "(guidance has two passes)", where=node.loc)
    return keyed(module, cond_view(node))


def inner_module(module: Module, node: Node, inner: Node) -> Module:
    """`module` with `inner` in place of `node` (split workers find their component by name)."""
    return msgspec.structs.replace(module, body=tuple(inner if n is node else n for n in module.body))


def cfg_program(node: Node, backend: str, programs: list[Path], weights: list[Path], **kw):
    """A CfgProgram over the inner program's per-rank files (one set, loaded by both groups)."""
    from difflet.codegen.split_codegen import split_program
    from difflet.parallel.cfg_program import CfgProgram

    inner = cond_view(node)
    return CfgProgram(node, inner, lambda g: split_program(inner, backend, programs, weights,
                                                           first_rank=g * len(programs), **kw))


def eager_cfg_program(module: Module, node: Node, ckpt: str | os.PathLike, **kw):
    """A CfgProgram over uncompiled inner programs built from the checkpoint (same numerics)."""
    from difflet.codegen.split_codegen import eager_split_program, world
    from difflet.parallel.cfg_program import CfgProgram

    inner = cond_view(node)
    mod = inner_module(module, node, inner)
    return CfgProgram(node, inner, lambda g: eager_split_program(mod, inner, ckpt,
                                                                 first_rank=g * world(inner), **kw))
