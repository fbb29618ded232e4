"""`codegen(module, weights, out)`: a plain loop over components -> store -> ART/.

Invariants:
- Only planned IR is accepted (every component has a cache_key); pipeline IR is refused with a
  hint to run `difflet opt`.
- A component whose cache key is in the store is reused, never compiled; the store compiles a
  key once even under concurrent codegens.
- manifest.json is written last, so a directory with a manifest is a finished ART.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from difflet.codegen.artifacts import (FORMAT_VERSION, MANIFEST, MODULE_FILE, program_paths, runtime_json,
                                       schedule_json, sha256_file, value_json)
from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Op, thaw


@dataclass
class CodegenResult:
    out: Path
    compiled: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)


def _require_planned(module: Module) -> None:
    if module.level != "planned":
        raise DiffletError(f"codegen needs planned IR, got {module.level!r} level; run "
                           "`difflet opt IN.ir -o OUT.ir` first", where=module.loc)
    for comp in module.components():
        if not comp.attrs.get("cache_key"):
            raise DiffletError(f"component {comp.name!r} has no cache_key; run `difflet opt` first",
                               where=comp.loc)
        for layout in comp.find(Op.LAYOUT):
            from difflet.codegen.split_layout import unsupported_reason

            reason = unsupported_reason(comp)
            if reason:
                raise DiffletError(f"component {comp.name!r} is planned for {layout.attrs.get('world')} ranks; "
                                   f"{reason}", where=layout.loc)


def _copy_host(ckpt: Path, module: Module, host: Path) -> dict[str, str]:
    """Copy tokenizers and the scheduler config (what host steps need) from the checkpoint."""
    subs = [c.attrs["tokenizer"].get("subfolder", "tokenizer") for c in module.components()
            if c.attrs.get("tokenizer") is not None] + ["scheduler"]
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


def codegen(module: Module, weights: str | os.PathLike, out: str | os.PathLike, backend: str = "inductor",
            store: str | os.PathLike | None = None, log: Callable[[str], Any] = print) -> CodegenResult:
    """Compile (or reuse) every component of planned `module` and write a self-contained ART at `out`.

    `weights` is a diffusers-format checkpoint directory or `random:SEED`.
    """
    import torch

    import difflet
    from difflet.codegen.backends import get_backend
    from difflet.codegen.build import build_program_module
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.split_codegen import world as split_world
    from difflet.codegen.store import Store
    from difflet.ir import binary

    _require_planned(module)
    get_backend(backend)  # an unavailable backend (neuron here) fails before any work
    the_store = Store(store)
    ckpt = resolve_weights(module, str(weights), the_store.root)
    out = Path(out)
    (out / "programs").mkdir(parents=True, exist_ok=True)
    (out / "weights").mkdir(parents=True, exist_ok=True)
    if (out / MANIFEST).exists():
        (out / MANIFEST).unlink()  # an ART without manifest is unfinished, never stale-but-valid
    result = CodegenResult(out)
    components: dict[str, Any] = {}
    for comp in module.components():
        key = comp.attrs["cache_key"]
        start = time.perf_counter()
        if split_world(comp) > 1:
            components[comp.name], created = _codegen_split(module, comp, ckpt, the_store, backend, out)
            seconds = time.perf_counter() - start
            result.seconds[comp.name] = seconds
            (result.compiled if created else result.reused).append(comp.name)
            log(f"compiling {comp.name} on {split_world(comp)} ranks ... {seconds:.1f} s" if created
                else f"reused {comp.name} x{split_world(comp)} ranks (key {key[:8]})")
            continue
        pm = build_program_module(comp, ckpt)
        entry = emit_program(comp, pm, comp.name, the_store, backend, out, result, log, start)
        components[comp.name] = {"role": comp.attrs.get("role"), "class": comp.attrs.get("class"), **entry}
        del pm
    from difflet.codegen.probe import codegen_probe  # the step-caching probe: own program and key

    probe = codegen_probe(module, ckpt, the_store, backend, out, result, log)
    binary.save(module, out / MODULE_FILE)
    host = _copy_host(ckpt, module, out / "host")
    manifest = {
        "format": FORMAT_VERSION, "model": module.name, "family": module.attrs.get("family"),
        "profile": thaw(module.attrs.get("profile")), "parallel": thaw(module.attrs.get("parallel")),
        "target": thaw(module.attrs.get("target")), "backend": backend,
        "versions": {"torch": torch.__version__, "difflet": difflet.__version__},
        "module": {"path": MODULE_FILE, "sha256": sha256_file(out / MODULE_FILE)},
        "host": "host", "host_files": host, "weights_source": str(weights),
        "components": components, "runtime": runtime_json(module), "schedule": schedule_json(module),
        **({"probe": probe} if probe else {}),
    }
    tmp = out / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, out / MANIFEST)
    result.manifest = manifest
    log(f"compiled {len(result.compiled)}, reused {len(result.reused)}")
    return result


def _codegen_split(module: Module, comp, ckpt: Path, store, backend: str, out: Path) -> tuple[dict, bool]:
    """Per-rank programs (compiled in rank workers, or reused) and presharded weights of `comp`;
    returns its manifest entry (rank 0's files also under program/weights) and whether it compiled."""
    from safetensors.torch import save_file

    from difflet.codegen.split_codegen import compile_split, degrees, rank_weights
    from difflet.codegen.store import link_or_copy

    if backend != "inductor":
        raise DiffletError(f"split programs of {comp.name!r} are built for the inductor backend only so far",
                           where="--backend")
    entries, created = compile_split(module, comp, ckpt, store, backend)
    ranks = []
    for r, entry in enumerate(entries):
        prog_rel, weights_rel = program_paths(comp.name, r)
        link_or_copy(entry / "program.pt2", out / prog_rel)
        save_file(rank_weights(comp, ckpt, entry, r, backend), str(out / weights_rel))
        ranks.append({"program": {"path": prog_rel, "sha256": sha256_file(out / prog_rel)},
                      "weights": {"path": weights_rel, "sha256": sha256_file(out / weights_rel)}})
    entry = {
        "role": comp.attrs.get("role"), "class": comp.attrs.get("class"), "cache_key": comp.attrs["cache_key"],
        "program": ranks[0]["program"], "weights": ranks[0]["weights"],
        "world": len(entries), "degrees": degrees(comp), "ranks": ranks,
        "inputs": [value_json(n.results[0]) for n in comp.find(Op.INPUT)],
        "outputs": [value_json(n.results[0]) for n in comp.find(Op.OUTPUT)],
    }
    return entry, created


def emit_program(node, pm, name: str, store, backend: str, out: Path, result: CodegenResult,
                 log: Callable[[str], Any], start: float) -> dict:
    """Compile (or reuse, by `node`'s cache key) one unsplit program and write it into ART/.

    Returns its manifest fields (cache_key, program, weights, inputs, outputs); records the
    component as compiled or reused in `result`.
    """
    from safetensors.torch import save_file

    from difflet.codegen.backends import get_backend
    from difflet.codegen.store import link_or_copy

    be, key = get_backend(backend), node.attrs["cache_key"]
    entry, created = store.get_or_create(backend, key, lambda tmp: be.compile_entry(node, pm, tmp),
                                         directory=True)
    prog_rel, weights_rel = program_paths(name)
    link_or_copy(entry / be.PROGRAM_FILE, out / prog_rel)
    save_file(be.program_weights(pm, entry), str(out / weights_rel))
    seconds = time.perf_counter() - start
    result.seconds[name] = seconds
    (result.compiled if created else result.reused).append(name)
    log(f"compiling {name} ... {seconds:.1f} s" if created else f"reused {name} (key {key[:8]})")
    return {"cache_key": key,
            "program": {"path": prog_rel, "sha256": sha256_file(out / prog_rel)},
            "weights": {"path": weights_rel, "sha256": sha256_file(out / weights_rel)},
            "inputs": [value_json(n.results[0]) for n in node.find(Op.INPUT)],
            "outputs": [value_json(n.results[0]) for n in node.find(Op.OUTPUT)]}
