"""Rank groups of a parallel configuration: world = dp x cfg x cp x tp, tp innermost.

Invariants:
- rank = ((dp_i * cfg + cfg_i) * cp + cp_i) * tp + tp_i, the same order as
  difflet.passes.parallel_config (a test checks the two agree); `sp` adds no group, it
  reuses tp.
- `axis_groups` is pure (no torch.distributed): every group of ranks that differ only along
  one axis, in rank order; together the groups of one axis partition the world.
- `make_groups` must be called by every rank of an initialized default group with the same
  degrees: torch.distributed requires every rank to create every subgroup, in the same order.
  It returns this rank's group handle for each axis (a 1-rank group when the degree is 1, so
  callers never special-case; the collectives in this package short-circuit size-1 groups).
- Group names are torch's creation counter, and an exported/AOTInductor program bakes in the
  name of each group it communicates over (checked: the cp group of cp2 is "5"). So a process
  that loads compiled programs must call `make_groups` with the same config right after
  init_process_group, before creating any other group, to get the same names.
"""
from __future__ import annotations

from dataclasses import dataclass

AXES = ("dp", "cfg", "cp", "tp")  # outermost to innermost


def degrees_of(config) -> dict[str, int]:
    """{axis: degree} from anything with tp/cp/cfg/dp attributes (ParallelConfig) or a mapping."""
    get = config.get if isinstance(config, dict) else (lambda a, d: getattr(config, a, d))
    out = {a: int(get(a, 1)) for a in AXES}
    bad = {a: d for a, d in out.items() if d < 1}
    if bad:
        raise ValueError(f"parallel degrees must be >= 1, got {bad}")
    return out


def coords(rank: int, degrees: dict[str, int]) -> dict[str, int]:
    """This rank's index along every axis (inverse of the rank formula)."""
    out = {}
    for axis in reversed(AXES):
        out[axis] = rank % degrees[axis]
        rank //= degrees[axis]
    return out


def world_size(degrees: dict[str, int]) -> int:
    n = 1
    for a in AXES:
        n *= degrees[a]
    return n


def axis_groups(degrees: dict[str, int], axis: str) -> tuple[tuple[int, ...], ...]:
    """Every group of ranks differing only along `axis`, each in rank order, groups ordered by
    their smallest rank."""
    if axis not in AXES:
        raise ValueError(f"unknown axis {axis!r}; expected one of {AXES}")
    seen: dict[tuple, list[int]] = {}
    for r in range(world_size(degrees)):
        c = coords(r, degrees)
        seen.setdefault(tuple(c[a] for a in AXES if a != axis), []).append(r)
    return tuple(tuple(g) for g in seen.values())


@dataclass(frozen=True)
class RankGroups:
    """This rank's view: its coordinates, and per axis its group's ranks and process group."""
    rank: int
    degrees: dict
    coords: dict
    ranks: dict   # axis -> tuple of global ranks in this rank's group
    handles: dict  # axis -> torch.distributed ProcessGroup

    def group(self, axis: str):
        return self.handles[axis]

    def index(self, axis: str) -> int:
        """This rank's position inside its `axis` group."""
        return self.coords[axis]


def make_groups(config, rank: int | None = None) -> RankGroups:
    """Create the process groups of every axis (collective over the default group)."""
    import torch.distributed as dist

    degrees = degrees_of(config)
    world = dist.get_world_size()
    if world != world_size(degrees):
        raise ValueError(f"parallel degrees {degrees} need {world_size(degrees)} ranks, "
                         f"the default group has {world}")
    rank = dist.get_rank() if rank is None else rank
    ranks, handles = {}, {}
    for axis in AXES:
        for g in axis_groups(degrees, axis):
            handle = dist.new_group(list(g))  # every rank calls this for every group, in order
            if rank in g:
                ranks[axis], handles[axis] = g, handle
    return RankGroups(rank, degrees, coords(rank, degrees), ranks, handles)
