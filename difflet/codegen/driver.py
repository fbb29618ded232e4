"""`codegen(module, weights, out)`: every program (components, then the probe) -> store -> ART/.

Invariants:
- Only planned IR is accepted (every component has a cache_key); pipeline IR is refused with a
  hint to run `difflet opt`.
- A program whose cache key is in the store is reused, never compiled; the store compiles a
  key once even under concurrent codegens. Programs missing from the store are compiled
  concurrently in worker processes (difflet/codegen/compile_pool.py) when more than one is
  missing; the output (programs, weights, manifest) is the same as compiling one by one.
- One log line per program: its name, compiled or reused, seconds; then "compiled N, reused M".
  Library warnings and progress bars are silenced unless `verbose`.
- manifest.json is written last, so a directory with a manifest is a finished ART.
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from difflet.codegen.artifacts import program_paths, runtime_settings, schedule_steps
from difflet.codegen.artifacts import manifest_entry
from difflet.codegen.emit import emit_program, program_nodes
from difflet.codegen.manifest import (FORMAT_VERSION, MANIFEST, MODULE_FILE, Component, Manifest, RankFiles,
                                      Versions, file_ref, write_manifest)
from difflet.errors import DiffletError
from difflet.ir.buckets import base_name, buckets
from difflet.ir.nodes import Module, Node, Op, thaw
from difflet.passes.targets import program_device  # torch-free


@dataclass
class CodegenResult:
    out: Path
    compiled: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    manifest: Manifest | None = None


def _require_planned(module: Module, backend: str = "inductor") -> None:
    if module.level != "planned":
        raise DiffletError(f"codegen needs planned IR, got {module.level!r} level; run "
                           "`difflet opt IN.ir -o OUT.ir` first", where=module.loc)
    _require_current_keys(module, backend)
    for comp in module.components():
        if not comp.attrs.get("cache_key"):
            raise DiffletError(f"component {comp.name!r} has no cache_key; run `difflet opt` first",
                               where=comp.loc)
        from difflet.passes.built import blocks_reason

        reason = blocks_reason(comp, backend)
        if reason:
            raise DiffletError(f"component {comp.name!r} has front_blocks {comp.attrs.get('front_blocks')}; "
                               f"{reason}", where=comp.loc)
        for layout in comp.find(Op.LAYOUT):
            from difflet.codegen.split_layout import unsupported_reason

            reason = unsupported_reason(comp, backend, program_device(module.attrs.get("target")))
            if reason:
                raise DiffletError(f"component {comp.name!r} is planned for {layout.attrs.get('world')} ranks; "
                                   f"{reason}", where=layout.loc)


def _require_current_keys(module: Module, backend: str) -> None:
    """Refuse IR keyed under another toolchain: `difflet opt` hashes the Difflet program sources and
    the compiler's versions into each key, so a program compiled here under such a key would answer
    for programs this toolchain does not build (a stale IR after an upgrade or a source edit)."""
    from difflet.passes.cache_key import compiler_version, difflet_version

    planned = {"difflet": module.attrs.get("difflet_version"), "toolchain": module.attrs.get("compiler")}
    here = {"difflet": difflet_version(), "toolchain": compiler_version(module.attrs.get("backend", backend))}
    stale = [f"{k} {planned[k]} (here {here[k]})" for k in planned if planned[k] != here[k]]
    if stale:
        raise DiffletError(f"the IR was planned under another {' and '.join(stale)}: its cache keys name "
                           "programs this installation does not build; run `difflet opt` on the lowered "
                           "IR again", where=module.loc)


def _check_buckets(module: Module, be) -> None:
    """Shape buckets are built for unsplit programs of a `shape_buckets` backend so far."""
    from difflet.passes.backend_facts import names_with

    if not buckets(module):
        return
    if not be.shape_buckets:
        raise DiffletError(f"shape buckets are built for the {', '.join(names_with('shape_buckets'))} backend "
                           f"only so far, not {be.name!r}", where="--backend")
    for comp in module.components():
        if comp.find(Op.LAYOUT) and _world(comp) > 1:
            raise DiffletError(f"component {comp.name!r} is split over {_world(comp)} ranks; split programs "
                               "with shape buckets are not built yet (plan tp1 or serve one size)", where=comp.loc)


def _copy_host(ckpt: Path, module: Module, host: Path) -> dict[str, str]:
    """Copy tokenizers, the folders classes declare their host steps read (an image processor)
    and the scheduler config (what host steps need) from the checkpoint."""
    from difflet.codegen.declarations import declaration

    subs = [c.attrs["tokenizer"].get("subfolder", "tokenizer") for c in module.components()
            if c.attrs.get("tokenizer") is not None]
    subs += [f for c in module.components() for f in declaration(str(c.attrs.get("class"))).host_folders]
    subs.append("scheduler")
    copied = {}
    for sub in subs:
        src = ckpt / sub
        if not src.is_dir():
            if sub == "scheduler":
                continue  # the scheduler config also lives in the schedule step attrs
            raise DiffletError(f"checkpoint has no {sub}/ folder", where=src)
        shutil.copytree(src, host / sub, dirs_exist_ok=True)
        copied[sub] = f"host/{sub}"
    return copied


def _world(node: Node) -> int:
    from difflet.codegen.split_codegen import world

    return world(node) if node.op == Op.COMPONENT else 1


def _cfg(node: Node) -> int:
    from difflet.passes.cfg_branch import cfg_degree

    return cfg_degree(node) if node.op == Op.COMPONENT else 1


def _log_line(name: str, created: bool, seconds: float, key: str, world: int = 1, branches: int = 0) -> str:
    ranks = f" on {world} ranks" if world > 1 else f" as {branches} branch programs" if branches else ""
    return f"{name}: {'compiled' if created else 'reused'}{ranks} in {seconds:.1f} s (key {key[:8]})"


def codegen(module: Module, weights: str | os.PathLike, out: str | os.PathLike, backend: str = "inductor",
            store: str | os.PathLike | None = None, log: Callable[[str], Any] = print,
            verbose: bool = False) -> CodegenResult:
    """Compile (or reuse) every program of planned `module` and write a self-contained ART at `out`.

    `weights` is a diffusers-format checkpoint directory or `random:SEED`.
    """
    from difflet.codegen.quiet import quiet_libraries

    with quiet_libraries(verbose):
        return _codegen(module, weights, Path(out), backend, store, log, verbose)


def _codegen(module: Module, weights, out: Path, backend: str, store, log, verbose: bool) -> CodegenResult:
    import torch

    from difflet.codegen.backends import get_backend
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.compile_pool import CompilePool
    from difflet.codegen.store import Store
    from difflet.version import __version__
    from difflet.ir import binary

    _require_planned(module, backend)
    be = get_backend(backend)  # an unavailable backend (neuron here) fails before any work
    be.require_device(program_device(module.attrs.get("target")))  # and a device this machine lacks
    _check_buckets(module, be)
    the_store = Store(store)
    ckpt = resolve_weights(module, str(weights), the_store.root)
    (out / "programs").mkdir(parents=True, exist_ok=True)
    (out / "weights").mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # an ART without manifest is unfinished, never stale-but-valid
    for name in {base_name(c) for c in module.components() if c.attrs.get("bucket") is not None}:
        (out / program_paths(name)[1]).unlink(missing_ok=True)  # shared weights: rewritten once below
    result = CodegenResult(out)
    nodes = program_nodes(module)
    entries: dict[str, Component] = {}

    def record(node: Node, entry: Component, created: bool, seconds: float) -> None:
        entries[node.name] = entry
        result.seconds[node.name] = seconds
        (result.compiled if created else result.reused).append(node.name)
        log(_log_line(node.name, created, seconds, entry.cache_key, entry.world, len(entry.branches)))

    from difflet.codegen.branches import branch_views, target_control_flow

    # branch sets compile here, each branch reused by its own key (codegen/branches.py)
    control_flow = target_control_flow(module)
    missing = [n for n in nodes if _world(n) == 1 and _cfg(n) == 1 and not branch_views(n, control_flow)
               and not the_store.has(backend, n.attrs["cache_key"])]
    with CompilePool(module, missing, ckpt, the_store.root, backend, out, verbose) as pool:
        for node in nodes:
            if node not in pool:  # reused, split, or compiled here when the pool is not worth it
                start = time.perf_counter()
                entry, created = (_codegen_cfg(module, node, ckpt, the_store, be, out) if _cfg(node) > 1
                                  else _codegen_split(module, node, ckpt, the_store, be, out) if _world(node) > 1
                                  else emit_program(module, node.name, ckpt, the_store, backend, out))
                record(node, entry, created, time.perf_counter() - start)
        for node, entry, created, seconds in pool.results():
            record(node, entry, created, seconds)
    binary.save(module, out / MODULE_FILE)
    manifest = Manifest(
        format=FORMAT_VERSION, model=module.name, family=str(module.attrs.get("family")),
        profile=thaw(module.attrs.get("profile")) or {}, parallel=thaw(module.attrs.get("parallel")) or {},
        target=str(module.attrs.get("target")), backend=backend,
        versions=Versions(torch=str(torch.__version__), difflet=str(__version__)),
        module=file_ref(out, MODULE_FILE), host="host", host_files=_copy_host(ckpt, module, out / "host"),
        weights_source=str(weights), components={n.name: entries[n.name] for n in nodes},
        runtime=runtime_settings(module), schedule=schedule_steps(module), buckets=buckets(module))
    write_manifest(out, manifest)
    result.manifest = manifest
    log(f"compiled {len(result.compiled)}, reused {len(result.reused)}")
    return result


def _codegen_split(module: Module, comp: Node, ckpt: Path, store, be, out: Path) -> tuple[Component, bool]:
    """Per-rank programs (compiled in rank workers, or reused) and presharded weights of `comp`;
    returns its manifest entry and whether it compiled."""
    from difflet.codegen.split_codegen import compile_split, degrees

    if be.spmd_splits:  # one SPMD program for every rank, not a program per rank
        # the one SPMD emitter; a backends.py entry would be an import cycle (neuron_spmd -> emit -> backends)
        from difflet.codegen.neuron_spmd import emit_spmd

        return emit_spmd(comp, ckpt, store, out)
    if comp.attrs.get("front_blocks"):  # block mode's front and rest, per rank
        from difflet.codegen.block_emit import emit_blocks

        return emit_blocks(module, comp, ckpt, store, be.name, out)
    entries, created = compile_split(module, comp, ckpt, store, be.name)
    return manifest_entry(comp, comp, _rank_files(comp, entries, ckpt, be, out), world=len(entries),
                          degrees=dict(degrees(comp))), created


def _rank_files(comp: Node, entries: list[Path], ckpt: Path, be, out: Path) -> list[RankFiles]:
    """Link each rank's program into ART/ and write its presharded weights."""
    from safetensors.torch import save_file

    from difflet.codegen.split_codegen import rank_weights
    from difflet.codegen.store import link_or_copy

    ranks = []
    for r, entry in enumerate(entries):
        prog_rel, weights_rel = program_paths(comp.name, r)
        link_or_copy(entry / be.PROGRAM_FILE, out / prog_rel)
        save_file(rank_weights(comp, ckpt, entry, r, be.name), str(out / weights_rel))
        ranks.append(RankFiles(file_ref(out, prog_rel), file_ref(out, weights_rel)))
    return ranks


def _codegen_cfg(module: Module, comp: Node, ckpt: Path, store, be, out: Path) -> tuple[Component, bool]:
    """A cfg2 component: its inner layout's programs (reused from the store when the plain inner
    plan compiled them) and that layout's weight files, once; the entry records cfg for the loader."""
    from difflet.codegen.cfg_program import inner_module, inner_node
    from difflet.codegen.emit import emit_node
    from difflet.codegen.split_codegen import compile_split, degrees

    inner = inner_node(module, comp)
    if _world(inner) == 1:
        entry, created = emit_node(inner, ckpt, store, be.name, out, program_device(module.attrs.get("target")))
        ranks = list(entry.ranks)
    else:
        if not be.rank_splits:  # a cfg group's inner split is per-rank programs in rank workers
            from difflet.passes.backend_facts import names_with

            raise DiffletError(f"split programs of {comp.name!r} are built for the "
                               f"{', '.join(names_with('rank_splits'))} backend only so far", where="--backend")
        entries, created = compile_split(inner_module(module, comp, inner), inner, ckpt, store, be.name)
        ranks = _rank_files(inner, entries, ckpt, be, out)
    return manifest_entry(comp, comp, ranks, world=len(ranks), degrees=dict(degrees(inner)),
                          cfg=_cfg(comp)), created
