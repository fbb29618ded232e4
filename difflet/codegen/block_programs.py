"""A denoiser planned with `front_blocks = K` as two programs over one weights file (compiled by
codegen/block_emit.py), and the runner that serves them as one program.

Invariants:
- Each part's program view is the component with its extra values appended after the IR's
  (front: inputs residual_<s> for each tail stream s, outputs front_<s> for every stream; rest:
  inputs front_<s>, outputs residual_<s>; shapes from one eager run of the front), so each is
  a Program-convention module (codegen/blocks.py) compiled under its own key
  `part_key(cache_key, part)` (per rank under a tp layout: split_codegen.rank_key of it); the
  IR's cache key already holds `front_blocks`.
- The checkpoint tensors both parts load are one file per rank (`weights` of both parts'
  RankFiles), loaded once at serving (the CompiledRunner `shared` cache) by the one process
  that runs both parts (this one, or the rank's worker): every weight in memory once.
- `BlockRunner(*ir_inputs)` keeps the Program call convention: with no active block session it
  is the whole denoiser (front with zero residuals, then rest); in a block-mode request it
  defers to the session (stepcache/blocks.py).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

from difflet.ir.nodes import Node, Op, TensorType, Value

FRONT, REST = "front", "rest"
PARTS = (FRONT, REST)


def part_key(cache_key: str, part: str) -> str:
    """The store key of a block-mode part's program (hex, like every store key)."""
    return hashlib.sha256(f"{cache_key}:blocks:{part}".encode()).hexdigest()


def part_view(node: Node, part: str, streams: dict[str, tuple[tuple[int, ...], str]], tail: tuple[str, ...]) -> Node:
    """The component as `part`'s program sees it: its IR values, then the part's extra ones."""
    def value(op: Op, name: str) -> Node:
        shape, dtype = streams[name.partition("_")[2]]
        return Node(op=op, name=name, results=(Value(name, TensorType(dtype, shape)),))

    if part == FRONT:
        extra = [value(Op.INPUT, f"residual_{s}") for s in tail] + [value(Op.OUTPUT, f"front_{s}") for s in streams]
    else:
        extra = [value(Op.INPUT, f"front_{s}") for s in streams] + [value(Op.OUTPUT, f"residual_{s}") for s in tail]
    return msgspec.structs.replace(node, body=(*node.body, *extra),
                                   attrs=node.attrs.set(cache_key=part_key(node.attrs["cache_key"], part)))


def load_parts(root: Path, manifest, node: Node, name: str, entry, verify: bool, shared: dict | None):
    """A block-mode denoiser's BlockRunner: its parts' programs over each rank's one weights file
    (world 1: in this process, each weight loaded once; a tp layout: one group of rank workers
    that each load both parts, `BlockRank`); each part's key checked against the component's."""
    from difflet.codegen.declarations import declaration
    from difflet.errors import DiffletError

    for part in entry.parts:
        if verify and part.cache_key != part_key(entry.cache_key, part.part):
            raise DiffletError(f"{part.part} program of {name!r} does not belong to the component's cache key; "
                               "re-run `difflet codegen`", where=root / part.ranks[0].program.path)
    front, rest = entry.parts
    decl = declaration(str(node.attrs.get("class"))).blocks
    residuals = [(tuple(v.shape), v.dtype) for v in front.inputs[len(entry.inputs):]]
    paths = [tuple(str(root / p) for p in (f.program.path, r.program.path, f.weights.path, f.constants.path,
                                           r.constants.path)) for f, r in zip(front.ranks, rest.ranks, strict=True)]
    if entry.world == 1:
        rank = load_block_rank(0, None, manifest.backend, *paths[0], shared=shared)
        return BlockRunner(rank.front, rank.rest, len(entry.outputs), decl.tail, decl.outputs, residuals)
    import torch

    from difflet.codegen.backends import get_backend
    from difflet.parallel.workers import SplitProgram

    get_backend(manifest.backend).prepare_rank_loads()  # once here, not by every rank worker at once
    workers = SplitProgram(node, dict(entry.degrees), load_block_rank, [(manifest.backend, *p) for p in paths])
    front_sel, rest_sel = torch.tensor(0), torch.tensor(1)
    return BlockRunner(lambda *t: workers.unchecked(front_sel, *t), lambda *t: workers.unchecked(rest_sel, *t),
                       len(entry.outputs), decl.tail, decl.outputs, residuals, close=workers.close)


class BlockRank:
    """One rank's front and rest programs over its one weights file; `rank(which, *tensors)`
    runs the front (which = 0) or the rest (1): a rank worker's runner."""

    def __init__(self, front, rest) -> None:
        self.front, self.rest = front, rest

    def __call__(self, which, *tensors):
        return (self.front if int(which) == 0 else self.rest)(*tensors)


def load_block_rank(rank: int, groups, backend: str, front: str, rest: str, weights: str, front_constants: str,
                    rest_constants: str, shared: dict | None = None) -> BlockRank:
    """Both parts' programs of one rank, every weight of the shared file loaded once; in a rank
    worker (`groups` given) as the backend's rank runner (inductor: the GIL released while the
    program waits on a collective, parallel/aoti_runner.py)."""
    from difflet.codegen.backends import get_backend

    be, shared = get_backend(backend), shared if shared is not None else {}
    load = be.load if groups is None else be.load_rank
    return BlockRank(load(Path(front), Path(weights), Path(front_constants), shared),
                     load(Path(rest), Path(weights), Path(rest_constants), shared))


class BlockRunner:
    """Front and rest as one runner of the denoiser's IR call convention (module docstring)."""

    def __init__(self, front, rest, n_outputs: int, tail: tuple[str, ...], streams: tuple[str, ...],
                 residual_specs: list, close=None) -> None:
        self._front, self._rest, self.n = front, rest, n_outputs
        self._close = close  # a split's rank workers
        self.tail, self.streams = tail, streams
        self.watched = streams.index(tail[0])  # the stream block mode's score reads
        self._specs = residual_specs  # (shape, dtype name) per tail stream
        self._zeros = None

    def close(self) -> None:
        if self._close is not None:
            self._close()

    def zero_residuals(self):
        import torch

        if self._zeros is None:
            self._zeros = tuple(torch.zeros(shape, dtype=getattr(torch, dtype)) for shape, dtype in self._specs)
        return self._zeros

    def front(self, inputs: tuple, residuals: tuple) -> tuple[tuple, tuple]:
        out = self._front(*inputs, *residuals)
        return tuple(out[:self.n]), tuple(out[self.n:])

    def rest(self, inputs: tuple, streams: tuple) -> tuple[tuple, tuple]:
        out = self._rest(*inputs, *streams)
        return tuple(out[:self.n]), tuple(out[self.n:])

    def __call__(self, *inputs):
        from difflet.stepcache.blocks import current

        session = current()
        if session is not None:
            return session.call(self, inputs)
        _, streams = self.front(inputs, self.zero_residuals())
        return self.rest(inputs, streams)[0]
