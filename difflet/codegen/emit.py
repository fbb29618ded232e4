"""One unsplit program into ART/: compile or reuse it by its cache key, write its files, make its
manifest entry. Used by the driver in-process and by compile_pool's workers, so both do exactly
the same; this module imports neither of them.

Invariants:
- A program whose cache key is in the store is reused, never compiled.
- A bucket program's checkpoint tensors go to one file shared by every size of its component,
  written once per codegen (atomically, by whichever size comes first).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from difflet.codegen.artifacts import manifest_entry, program_paths
from difflet.codegen.manifest import Component, RankFiles, file_ref
from difflet.errors import DiffletError
from difflet.ir.buckets import base_name
from difflet.ir.nodes import Module, Node, Op


def program_nodes(module: Module) -> list[Node]:
    """Every node codegen compiles, in manifest order: the components, then the probe if any."""
    from difflet.codegen.probe import probe_node

    probe = probe_node(module)
    return [*module.components(), *([probe] if probe is not None else [])]


def key_node(node: Node) -> Node:
    """The node a program is compiled from: the probe's pruned program view, else the node."""
    if node.op != Op.PROBE:
        return node
    from difflet.codegen.probe import program_view

    return program_view(node)


def emit_program(module: Module, name: str, ckpt: Path, store, backend: str, out: Path) -> tuple[Component, bool]:
    """Compile (or reuse, by its cache key) the unsplit program `name` (a component or the probe)
    and write it and its weights into ART/; returns its manifest entry and whether it compiled.
    On a target without control flow, a component that branches on a runtime input becomes one
    program per value (codegen/branches.py)."""
    from difflet.codegen.branches import branch_views, target_control_flow
    from difflet.passes.targets import program_device

    device = program_device(module.attrs.get("target"))
    node = next(n for n in program_nodes(module) if n.name == name)
    if node.attrs.get("front_blocks"):
        from difflet.codegen.block_emit import emit_blocks

        return emit_blocks(module, node, ckpt, store, backend, out)
    views = branch_views(node, target_control_flow(module))
    if views:
        return emit_branches(node, views, ckpt, store, backend, out, device)
    return emit_node(node, ckpt, store, backend, out, device)


def emit_node(node: Node, ckpt: Path, store, backend: str, out: Path,
              device: str | None = None) -> tuple[Component, bool]:
    """`emit_program` of one node (a cfg denoiser's inner view, too: codegen/cfg_program.py),
    compiled for `device` (the target's)."""
    from safetensors.torch import save_file

    from difflet.codegen.backends import get_backend
    from difflet.codegen.store import link_or_copy

    name = node.name
    if node.op == Op.PROBE:
        from difflet.codegen.probe import build_probe_module

        pm = build_probe_module(node, ckpt)
    else:
        from difflet.codegen.build import build_program_module

        pm = build_program_module(node, ckpt, backend)  # the backend picks the attention kernel
    knode = key_node(node)
    be, key = get_backend(backend), node.attrs["cache_key"]
    entry, created = store.get_or_create(backend, key, lambda tmp: be.compile_entry(knode, pm, tmp, device),
                                         directory=True)
    prog_rel, weights_rel = program_paths(name)
    link_or_copy(entry / be.PROGRAM_FILE, out / prog_rel)
    weights = be.program_weights(pm, entry)
    if node.attrs.get("bucket") is not None:
        files = _bucket_files(node, pm, weights, out, prog_rel)
    else:
        save_file(weights, str(out / weights_rel))
        files = RankFiles(file_ref(out, prog_rel), file_ref(out, weights_rel))
    extra = {"source": node.attrs.get("source")} if node.op == Op.PROBE else {}
    return manifest_entry(node, knode, [files], **extra), created


def _bucket_files(node: Node, pm, weights: dict, out: Path, prog_rel: str) -> RankFiles:
    """A bucket program's files: the checkpoint's tensors in one file that every size of the
    component shares (loaded once; written once per codegen, by whichever size comes first), its
    graph-made constants and non-persistent buffers (size-dependent tables) in its own."""
    from safetensors.torch import save_file

    # the checkpoint's tensors: parameters and persistent buffers (a non-persistent buffer may be
    # a size-dependent table a family's wrapper installs, e.g. a static RoPE grid: per size, not shared)
    known = set(pm.state_dict(keep_vars=True))
    shared_rel = program_paths(base_name(node))[1]
    constants_rel = program_paths(node.name)[1].replace(".safetensors", ".constants.safetensors")
    if not (out / shared_rel).exists():  # _codegen removed last run's; the first size writes it
        tmp = out / f"{shared_rel}.{os.getpid()}.tmp"
        save_file({k: v for k, v in weights.items() if k in known}, str(tmp))
        try:
            os.link(tmp, out / shared_rel)  # atomic, and refused if a concurrent worker was first
        except FileExistsError:
            pass
        tmp.unlink()
    save_file({k: v for k, v in weights.items() if k not in known}, str(out / constants_rel))
    return RankFiles(file_ref(out, prog_rel), file_ref(out, shared_rel), constants=file_ref(out, constants_rel))


def emit_branches(node: Node, views: list[tuple[int, Node]], ckpt: Path, store, backend: str,
                  out: Path, device: str | None = None) -> tuple[Component, bool]:
    """A branch set: each view's program (compiled or reused by its own key), the checkpoint
    tensors of all of them in one weights file (loaded once), each program's graph-made
    constants in its own file."""
    from safetensors.torch import save_file

    from difflet.codegen.backends import get_backend
    from difflet.codegen.build import build_program_module
    from difflet.codegen.inductor import module_tensors
    from difflet.codegen.manifest import Branch
    from difflet.codegen.store import link_or_copy

    if node.attrs.get("bucket") is not None:
        raise DiffletError(f"component {node.name!r}: branch programs with shape buckets are not built",
                           where=node.loc)
    be, shared = get_backend(backend), {}
    (input_name,) = views[0][1].attrs["branch"].keys()
    made, any_created = [], False
    for value, view in views:
        pm = build_program_module(view, ckpt, backend)
        entry, created = store.get_or_create(backend, view.attrs["cache_key"],
                                             lambda tmp, v=view, m=pm: be.compile_entry(v, m, tmp, device),
                                             directory=True)
        any_created |= created
        prog_rel, _ = program_paths(f"{node.name}.{input_name}{value}")
        link_or_copy(entry / be.PROGRAM_FILE, out / prog_rel)
        weights, known = be.program_weights(pm, entry), module_tensors(pm)
        shared.update({k: v for k, v in weights.items() if k in known})
        constants_rel = prog_rel.replace("programs/", "weights/").replace(".pt2", ".constants.safetensors")
        save_file({k: v for k, v in weights.items() if k not in known}, str(out / constants_rel))
        made.append((value, view.attrs["cache_key"], prog_rel, constants_rel))
        del pm
    weights_rel = program_paths(node.name)[1]
    save_file(shared, str(out / weights_rel))
    branches = tuple(Branch(value, key, RankFiles(file_ref(out, prog), file_ref(out, weights_rel),
                                                  constants=file_ref(out, consts)))
                     for value, key, prog, consts in made)
    return manifest_entry(node, node, [branches[0].files], branch_input=input_name, branches=branches), any_created
