"""The artifact directory ART/ and its loader: the contract between codegen and the runtime.

Layout (manifest.json says the same as data):
  manifest.json                           format, model, versions, components, schedule
  module.ir                               the planned IR (difflet.ir.binary)
  programs/<name>.rank<r>.pt2             compiled programs, hard-linked from the store (a split
                                          component has one per rank, listed under "ranks")
  weights/<name>.rank<r>.safetensors      each program's constants, from the checkpoint (presharded)
  host/{tokenizer,tokenizer_2,scheduler}  what the host schedule needs, copied from the checkpoint

Invariants:
- ART is self-contained: nothing in it points outside it.
- `load_artifacts(verify=True)` refuses (DiffletError naming the file and the reason) any file
  whose sha256 differs from the manifest, and any program whose cache key differs from the
  module's: the runtime never runs a program that is not the one the IR describes.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Node, Op, RuntimeType, Value, thaw

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MODULE_FILE = "module.ir"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def value_json(v: Value) -> dict[str, Any]:
    if isinstance(v.type, RuntimeType):
        return {"name": v.name, "kind": "runtime", "dtype": v.type.dtype, "lo": v.type.lo, "hi": v.type.hi}
    return {"name": v.name, "kind": "tensor", "dtype": v.type.dtype, "shape": list(v.type.shape)}


def schedule_json(module: Module) -> list[dict[str, Any]]:
    return [{"step": s.name, "args": list(s.args), "attrs": thaw(s.attrs)}
            for sched in module.find(Op.SCHEDULE) for s in sched.body]


def runtime_json(module: Module) -> list[dict[str, Any]]:
    return [{**value_json(n.results[0]), "default": n.attrs.get("default"), "doc": n.attrs.get("doc")}
            for n in module.find(Op.RUNTIME)]


def program_paths(name: str, rank: int = 0) -> tuple[str, str]:
    return f"programs/{name}.rank{rank}.pt2", f"weights/{name}.rank{rank}.safetensors"


class Program:
    """One component's callable program: `program(*tensors) -> tuple[Tensor, ...]` in IR order.

    Inputs are checked against the IR types (runtime values: 0-d int64 in their range; a Python
    int is accepted and converted) before the call.
    """

    def __init__(self, node: Node, runner: Callable[..., tuple]) -> None:
        from difflet.codegen.build import program_inputs, program_outputs

        self.node = node
        self.name = node.name
        self.inputs: list[Value] = program_inputs(node)
        self.outputs: list[Value] = program_outputs(node)
        self._runner = runner

    def __call__(self, *tensors):
        import torch

        from difflet.codegen.build import check_inputs

        tensors = tuple(torch.tensor(t, dtype=getattr(torch, v.type.dtype)) if isinstance(t, int) else t
                        for t, v in zip(tensors, self.inputs))
        check_inputs(self.node, tensors)
        with torch.no_grad():  # not inference_mode: callers may update outputs in place
            return tuple(self._runner(*tensors))

    def __repr__(self) -> str:
        return f"Program({self.name}: {[v.name for v in self.inputs]} -> {[v.name for v in self.outputs]})"


@dataclass
class Artifacts:
    root: Path
    manifest: dict
    module: Module
    host_dir: Path
    programs: dict[str, Program] = field(default_factory=dict)


def eager_programs(module: Module, ckpt_dir: str | os.PathLike) -> dict[str, Program]:
    """The uncompiled program modules, one per component, with the same call convention as ART's."""
    from difflet.codegen.build import build_program_module

    return {c.name: Program(c, build_program_module(c, ckpt_dir)) for c in module.components()}


def _check_hash(root: Path, entry: dict, what: str) -> Path:
    path = root / entry["path"]
    if not path.is_file():
        raise DiffletError(f"{what} is missing", where=path)
    got = sha256_file(path)
    if got != entry["sha256"]:
        raise DiffletError(f"{what} is corrupt or was modified: sha256 {got[:12]}... but the manifest "
                           f"records {entry['sha256'][:12]}...", where=path)
    return path


def read_manifest(root: Path) -> dict:
    path = root / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise DiffletError("not an artifact directory (no manifest.json); run `difflet codegen`",
                           where=root) from None
    except json.JSONDecodeError as err:
        raise DiffletError(f"manifest is not valid JSON: {err}", where=path) from None
    if manifest.get("format") != FORMAT_VERSION:
        raise DiffletError(f"manifest format {manifest.get('format')!r} is not {FORMAT_VERSION}; "
                           "re-run `difflet codegen`", where=path)
    return manifest


def load_artifacts(root: str | os.PathLike, verify: bool = True) -> Artifacts:
    """Load ART/: manifest, planned module, host dir and one loaded Program per component (a
    split component: a SplitProgram whose rank workers run until `.close()` or exit)."""
    from difflet.codegen.backends import load_runner
    from difflet.ir import binary

    root = Path(root)
    manifest = read_manifest(root)
    module_entry = manifest["module"]
    module_path = _check_hash(root, module_entry, "module IR") if verify else root / module_entry["path"]
    module = binary.load(module_path)
    programs: dict[str, Program] = {}
    for name, comp in manifest["components"].items():
        try:
            node = module.component(name)
        except KeyError:
            raise DiffletError(f"manifest lists component {name!r} that module.ir does not have",
                               where=root / MANIFEST) from None
        if verify:
            if comp["cache_key"] != node.attrs.get("cache_key"):
                raise DiffletError(f"program of {name!r} was built for cache key {comp['cache_key'][:12]}... "
                                   f"but module.ir says {str(node.attrs.get('cache_key'))[:12]}...; "
                                   "re-run `difflet codegen`", where=root / comp["program"]["path"])
            ranks = comp.get("ranks") or [comp]
            for r, files in enumerate(ranks):
                which = f" (rank {r})" if len(ranks) > 1 else ""
                _check_hash(root, files["program"], f"program of {name!r}{which}")
                _check_hash(root, files["weights"], f"weights of {name!r}{which}")
        if len(comp.get("ranks") or ()) > 1:
            from difflet.codegen.split_codegen import split_program

            programs[name] = split_program(node, manifest["backend"],
                                           [root / f["program"]["path"] for f in comp["ranks"]],
                                           [root / f["weights"]["path"] for f in comp["ranks"]])
            continue
        runner = load_runner(manifest["backend"], root / comp["program"]["path"], root / comp["weights"]["path"])
        programs[name] = Program(node, runner)
    return Artifacts(root, manifest, module, root / manifest.get("host", "host"), programs)
