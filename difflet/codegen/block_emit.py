"""Codegen of a block-mode denoiser (`front_blocks = K`): its front and rest programs, per rank
under a tp layout, with one weights file per rank (codegen/block_programs.py says what the
parts are and how they are served).

Invariants:
- A part's program is compiled from the family's program module cut by codegen/blocks.py
  (world 1) or from the rank module cut the same way in rank workers (split_codegen.part_module),
  under `part_key(cache_key, part)`; a program already in the store is reused, never compiled.
- Rank r's module tensors of both parts go into one file (weights/<name>.rank<r>.safetensors);
  each part's graph-made constants into its own.
"""
from __future__ import annotations

from pathlib import Path

from difflet.codegen.block_programs import FRONT, PARTS, part_view
from difflet.ir.nodes import Node, Op


def _streams(node: Node, front) -> dict[str, tuple[tuple[int, ...], str]]:
    """Stream name -> (shape, dtype name) after block K, from one eager run of the unsplit front
    (under tp alone every rank holds the whole streams, so a split part's are the same)."""
    from difflet.codegen.blocks import stream_shapes
    from difflet.codegen.build import example_inputs

    decl = front.decl
    found = stream_shapes(front, example_inputs(node))
    return {s: (shape, str(dtype).removeprefix("torch.")) for s, (shape, dtype) in zip(decl.outputs, found)}


def _write_rank(out: Path, name: str, rank: int, made: list[tuple[str, dict, set]], entries: dict, be):
    """Rank `rank`'s files: each part's program linked in, their module tensors in one weights
    file, each part's graph-made constants in its own; returns {part: RankFiles}."""
    from safetensors.torch import save_file

    from difflet.codegen.artifacts import program_paths
    from difflet.codegen.manifest import RankFiles, file_ref
    from difflet.codegen.store import link_or_copy

    shared, files = {}, {}
    weights_rel = program_paths(name, rank)[1]
    for part, weights, known in made:
        prog_rel, own_rel = program_paths(f"{name}.{part}", rank)
        link_or_copy(entries[part] / be.PROGRAM_FILE, out / prog_rel)
        shared.update({k: t for k, t in weights.items() if k in known})
        constants_rel = own_rel.replace(".safetensors", ".constants.safetensors")
        save_file({k: t for k, t in weights.items() if k not in known}, str(out / constants_rel))
        files[part] = (prog_rel, constants_rel)
    save_file(shared, str(out / weights_rel))
    return {part: RankFiles(file_ref(out, prog), file_ref(out, weights_rel), constants=file_ref(out, consts))
            for part, (prog, consts) in files.items()}


def emit_blocks(module, node: Node, ckpt: Path, store, backend: str, out: Path):
    """Compile (or reuse) the front and rest programs of `node` (per rank under a tp layout, in
    rank workers), write each rank's one shared weights file and each program's graph-made
    constants; returns (manifest entry, whether anything compiled)."""
    from difflet.codegen.artifacts import manifest_entry, value_spec
    from difflet.codegen.backends import get_backend
    from difflet.codegen.blocks import BlockModule
    from difflet.codegen.build import build_program_module
    from difflet.codegen.declarations import declaration
    from difflet.codegen.inductor import module_tensors
    from difflet.codegen.manifest import Part
    from difflet.codegen.split_codegen import compile_split, degrees, part_rank_weights, world

    decl, k = declaration(node.attrs["class"]).blocks, int(node.attrs["front_blocks"])
    front = BlockModule(build_program_module(node, ckpt, backend), decl, k, FRONT)  # unsplit: its streams
    from difflet.passes.targets import program_device

    be, streams = get_backend(backend), _streams(node, front)
    device = program_device(module.attrs.get("target"))
    views = {part: part_view(node, part, streams, decl.tail) for part in PARTS}
    n = world(node) if node.find(Op.LAYOUT) else 1
    front = front if n == 1 else None  # a split's parts are built from rank modules, in rank workers
    entries, made, any_created = {}, [[] for _ in range(n)], False
    for part in PARTS:
        if n == 1:
            bm = front if part == FRONT else BlockModule(build_program_module(node, ckpt, backend), decl, k, part)
            front = None  # the rest's load must not hold the front's model too
            entry, created = store.get_or_create(backend, views[part].attrs["cache_key"],
                                                 lambda tmp, v=views[part], m=bm: be.compile_entry(v, m, tmp, device),
                                                 directory=True)
            entries[part] = [entry]
            made[0].append((part, be.program_weights(bm, entry), set(module_tensors(bm))))
            del bm
        else:
            entries[part], created = compile_split(module, node, ckpt, store, backend, part=(part, streams))
            for r, entry in enumerate(entries[part]):
                made[r].append((part, *part_rank_weights(node, ckpt, entry, r, backend, (part, streams))))
        any_created |= created
    files = [_write_rank(out, node.name, r, made[r], {p: entries[p][r] for p in PARTS}, be) for r in range(n)]
    parts = tuple(Part(part, views[part].attrs["cache_key"], tuple(f[part] for f in files),
                       tuple(value_spec(v.results[0]) for v in views[part].find(Op.INPUT)),
                       tuple(value_spec(v.results[0]) for v in views[part].find(Op.OUTPUT)))
                  for part in PARTS)
    extra = {"world": n, "degrees": dict(degrees(node))} if n > 1 else {}
    return manifest_entry(node, node, list(parts[0].ranks), front_blocks=k, parts=parts, **extra), any_created
