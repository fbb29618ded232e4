"""Per-rank programs of a split component: compile in rank workers, preshard weights, load.

Invariants:
- Rank r's program is the store entry `rank_key(cache_key, r, world)`: the cache key plus the
  rank, so every rank's program is content-addressed separately and a hit never compiles.
- Compilation runs in `world` gloo rank processes that call `make_groups` first thing (the
  compiled graph bakes in the process-group names), each exporting its own rank module; all
  ranks trace together because export runs the module, collectives included.
- Presharded weights are cut in this process from the full checkpoint with no process group
  (sharding needs only the rank's coordinates), written as weights/<name>.rank<r>.safetensors:
  loading never reshards.
- A cfg layout never comes here: it is two replicas of its inner layout's programs
  (codegen/cfg_program.py).
- `split_program` / `eager_split_program` give a `SplitProgram` (a backend with `spmd_splits`:
  its one SPMD program, e.g. neuron_load.SpmdProgram, no rank workers) with the Program call
  convention (full tensors in, full outputs back); the visual scatter and the output gather are
  inside each rank's program (see split_layout.RankProgramModule).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from difflet.codegen.split_layout import build_rank_module, layout_of
from difflet.ir.nodes import Node
from difflet.passes.layout_attrs import Layout


def degrees(node: Node) -> dict[str, int]:
    """The degrees one replica's programs are built for: dp is always 1 here (a data-parallel
    layout is the same program on every replica; the runtime starts dp model processes)."""
    la = Layout.of(layout_of(node))
    return {a: 1 if a == "dp" else la.degree(a) for a in ("dp", "cfg", "cp", "tp")}


def world(node: Node) -> int:
    """Ranks of one replica of the component (passes/layout_attrs.py `Layout.replica_world`)."""
    return Layout.of(layout_of(node)).replica_world


def rank_key(cache_key: str, rank: int, world_size: int) -> str:
    """The store key of one rank's program (hex, like every store key)."""
    return hashlib.sha256(f"{cache_key}:rank{rank}/{world_size}".encode()).hexdigest()


def static_groups(node: Node, rank: int):
    """This rank's RankGroups without process groups: enough to shard weights, not to run."""
    from difflet.parallel.groups import AXES, RankGroups, axis_groups, coords

    deg = degrees(node)
    ranks = {a: next(g for g in axis_groups(deg, a) if rank in g) for a in AXES}
    return RankGroups(rank, deg, coords(rank, deg), ranks, {a: None for a in AXES})


def part_module(node: Node, ckpt, groups, part: tuple | None):
    """This rank's program module and the view it is compiled as: the rank module, or with
    `part` = (front|rest, streams) block mode's part of it (codegen/block_programs.py)."""
    pm = build_rank_module(node, ckpt, groups)
    if part is None:
        return pm, node
    from difflet.codegen.block_programs import part_view
    from difflet.codegen.blocks import BlockModule
    from difflet.codegen.declarations import declaration

    decl = declaration(node.attrs["class"]).blocks
    bm = BlockModule(pm, decl, int(node.attrs["front_blocks"]), part[0])
    return bm, part_view(node, part[0], part[1], decl.tail)


def _compile_rank(rank: int, world_size: int, module_bytes: bytes, name: str, ckpt: str,
                  store_root: str, backend: str, part: tuple | None = None) -> bool:
    """Body of one compile rank (run by run_ranks): export + compile this rank's program."""
    from difflet.codegen.backends import get_backend
    from difflet.codegen.store import Store
    from difflet.ir import binary
    from difflet.parallel.groups import make_groups

    node = binary.decode(module_bytes).component(name)
    groups = make_groups(degrees(node))  # first group creation in this process: names match loaders
    be = get_backend(backend)
    pm, view = part_module(node, ckpt, groups, part)
    _, created = Store(store_root).get_or_create(
        backend, rank_key(view.attrs["cache_key"], rank, world_size),
        lambda tmp: be.compile_entry(view, pm, tmp), directory=True)
    return created


def compile_split(module, node: Node, ckpt: str | os.PathLike, store, backend: str = "inductor",
                  timeout: float = 1800.0, part: tuple | None = None) -> tuple[list[Path], bool]:
    """Every rank's store entry for `node` (compiling in rank workers if any is missing);
    returns (entries in rank order, whether anything was compiled). `part`: block mode's
    (front|rest, streams) program of it instead (`part_module`)."""
    from difflet.ir import binary
    from difflet.parallel.launch import run_ranks

    n = world(node)
    key = node.attrs["cache_key"]
    if part is not None:
        from difflet.codegen.block_programs import part_key

        key = part_key(key, part[0])
    keys = [rank_key(key, r, n) for r in range(n)]
    created = False
    if not all(store.has(backend, k) for k in keys):
        # every rank must take part: export runs the collectives, so all ranks trace together
        made = run_ranks(_compile_rank, n, binary.encode(module), node.name, str(ckpt), str(store.root),
                         backend, part, timeout=timeout)
        created = any(made)
    return [store.path(backend, k) for k in keys], created


def rank_weights(node: Node, ckpt: str | os.PathLike, entry: Path, rank: int, backend: str = "inductor"):
    """Rank `rank`'s presharded constants for the program in `entry`."""
    return part_rank_weights(node, ckpt, entry, rank, backend, None)[0]


def part_rank_weights(node: Node, ckpt, entry: Path, rank: int, backend: str, part: tuple | None):
    """(rank `rank`'s presharded constants for the program in `entry`, the names among them
    that are module tensors rather than graph-made constants); `part` as `part_module`'s."""
    from difflet.codegen.backends import get_backend
    from difflet.codegen.inductor import module_tensors

    pm, _ = part_module(node, ckpt, static_groups(node, rank), part)
    return get_backend(backend).program_weights(pm, entry), set(module_tensors(pm))


def load_compiled_rank(rank: int, groups, backend: str, program: str, weights: str):
    """Worker loader: the rank's compiled program with its presharded weights (the backend's
    rank runner: an inductor rank program runs with the GIL released, parallel.aoti_runner)."""
    from difflet.codegen.backends import get_backend

    return get_backend(backend).load_rank(Path(program), Path(weights))


def load_eager_rank(rank: int, groups, module_bytes: bytes, name: str, ckpt: str):
    """Worker loader: the rank's uncompiled split module (same numerics as its program)."""
    from difflet.ir import binary

    return build_rank_module(binary.decode(module_bytes).component(name), ckpt, groups)


def split_program(node: Node, backend: str, programs: list[Path], weights: list[Path], **kw):
    """A SplitProgram over compiled per-rank programs (rank order); an spmd_splits backend's one
    program for every rank runs from this process instead (no rank workers)."""
    from difflet.codegen.backends import get_backend
    from difflet.parallel.workers import SplitProgram
    from difflet.passes.backend_facts import backend_facts

    if backend_facts(backend).spmd_splits:
        if kw:
            from difflet.errors import DiffletError

            raise DiffletError(f"{node.name!r}: a {backend} SPMD program takes no rank-worker options "
                               f"({', '.join(kw)}); cfg layouts are not built for {backend}", where=node.loc)
        return get_backend(backend).spmd_program(node, list(programs), list(weights))
    args = [(backend, str(p), str(w)) for p, w in zip(programs, weights, strict=True)]
    get_backend(backend).prepare_rank_loads()  # once here, not by every rank worker at once
    return SplitProgram(node, degrees(node), load_compiled_rank, args, **kw)


def eager_split_program(module, node: Node, ckpt: str | os.PathLike, **kw):
    """A SplitProgram over uncompiled rank modules built from the checkpoint."""
    from difflet.ir import binary
    from difflet.parallel.workers import SplitProgram

    data = binary.encode(module)
    return SplitProgram(node, degrees(node), load_eager_rank,
                        [(data, node.name, str(ckpt))] * world(node), **kw)
