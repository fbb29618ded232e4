"""A denoiser planned with `front_blocks = K` as two programs over one weights file, and the
runner that serves them as one program.

Invariants:
- Each part's program view is the component with its extra values appended after the IR's
  (front: inputs residual_<s> for each tail stream s, outputs front_<s> for every stream; rest:
  inputs front_<s>, outputs residual_<s>; shapes from one eager run of the front), so each is
  a Program-convention module (codegen/blocks.py) compiled under its own key
  `part_key(cache_key, part)`; the IR's cache key already holds `front_blocks`.
- The checkpoint tensors both parts load are one file (`weights` of both parts' RankFiles),
  loaded once at serving (the CompiledRunner `shared` cache): every weight in memory once.
- `BlockRunner(*ir_inputs)` keeps the Program call convention: with no active block session it
  is the whole denoiser (front with zero residuals, then rest); in a block-mode request it
  defers to the session (stepcache/blocks.py).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

from difflet.codegen.blocks import FRONT, REST
from difflet.ir.nodes import Node, Op, TensorType, Value

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


def emit_blocks(node: Node, ckpt: Path, store, backend: str, out: Path):
    """Compile (or reuse) the front and rest programs of `node`, write them with one shared
    weights file and each part's graph-made constants; returns (manifest entry, compiled any)."""
    from safetensors.torch import save_file

    from difflet.codegen.artifacts import program_paths, value_spec
    from difflet.codegen.backends import get_backend
    from difflet.codegen.blocks import BlockModule, stream_shapes
    from difflet.codegen.build import build_program_module, example_inputs
    from difflet.codegen.declarations import declaration
    from difflet.codegen.emit import manifest_entry
    from difflet.codegen.inductor import module_tensors
    from difflet.codegen.manifest import Part, RankFiles, file_ref
    from difflet.codegen.store import link_or_copy

    decl, k = declaration(node.attrs["class"]).blocks, int(node.attrs["front_blocks"])
    be, shared, parts, any_created = get_backend(backend), {}, [], False
    streams = None
    for part in PARTS:
        bm = BlockModule(build_program_module(node, ckpt, backend), decl, k, part)
        if streams is None:
            found = stream_shapes(bm, example_inputs(node))
            streams = {s: (shape, str(dtype).removeprefix("torch.")) for s, (shape, dtype) in zip(decl.outputs, found)}
        view = part_view(node, part, streams, decl.tail)
        entry, created = store.get_or_create(backend, view.attrs["cache_key"],
                                             lambda tmp, v=view, m=bm: be.compile_entry(v, m, tmp), directory=True)
        any_created |= created
        prog_rel = program_paths(f"{node.name}.{part}")[0]
        link_or_copy(entry / be.PROGRAM_FILE, out / prog_rel)
        weights, known = be.program_weights(bm, entry), module_tensors(bm)
        shared.update({name: t for name, t in weights.items() if name in known})
        constants_rel = program_paths(f"{node.name}.{part}")[1].replace(".safetensors", ".constants.safetensors")
        save_file({name: t for name, t in weights.items() if name not in known}, str(out / constants_rel))
        parts.append((part, view, prog_rel, constants_rel))
        del bm
    weights_rel = program_paths(node.name)[1]
    save_file(shared, str(out / weights_rel))
    made = tuple(Part(part, view.attrs["cache_key"],
                      RankFiles(file_ref(out, prog), file_ref(out, weights_rel), constants=file_ref(out, consts)),
                      tuple(value_spec(n.results[0]) for n in view.find(Op.INPUT)),
                      tuple(value_spec(n.results[0]) for n in view.find(Op.OUTPUT)))
                 for part, view, prog, consts in parts)
    return manifest_entry(node, node, [made[0].files], front_blocks=k, parts=made), any_created


class BlockRunner:
    """Front and rest as one runner of the denoiser's IR call convention (module docstring)."""

    def __init__(self, front, rest, n_outputs: int, tail: tuple[str, ...], streams: tuple[str, ...],
                 residual_specs: list) -> None:
        self._front, self._rest, self.n = front, rest, n_outputs
        self.tail, self.streams = tail, streams
        self.watched = streams.index(tail[0])  # the stream block mode's score reads
        self._specs = residual_specs  # (shape, dtype name) per tail stream
        self._zeros = None

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
