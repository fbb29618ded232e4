"""The artifact directory ART/ and its loader: the contract between codegen and the runtime.

Layout (manifest.json says the same as data; its structs are difflet/codegen/manifest.py):
  manifest.json                           format, model, versions, components, schedule
  module.ir                               the planned IR (difflet.ir.binary)
  programs/<name>.rank<r>.pt2             compiled programs, hard-linked from the store (one per
                                          rank, listed under the entry's "ranks"; the probe too; a
                                          cfg2 entry: its inner layout's ranks, loaded twice)
  weights/<name>.rank<r>.safetensors      each program's constants, from the checkpoint (presharded);
                                          a bucketed component's sizes share weights/<base>.rank0
                                          and keep their own <name@size>.rank0.constants
  host/{tokenizer,tokenizer_2,scheduler}  what the host schedule needs, copied from the checkpoint

Invariants:
- ART is self-contained: nothing in it points outside it.
- Every manifest entry, the probe included, loads through the same code (`load_artifacts`);
  only the wrapper differs (a `ProbeProgram` for role "probe", else a `Program`).
- `load_artifacts(verify=True)` refuses (DiffletError naming the file and the reason) any file
  whose sha256 differs from the manifest, and any program whose cache key differs from the
  module's: the runtime never runs a program that is not the one the IR describes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from difflet.codegen.manifest import (MANIFEST, PROBE_ROLE, Component, FileRef, Manifest, RankFiles,
                                      RuntimeSetting, ScheduleStep, ValueSpec, read_manifest, sha256_file)
from difflet.codegen.program import Program  # noqa: F401 - the loader's call convention
from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Node, Op, RuntimeType, Value, thaw


def value_spec(v: Value) -> ValueSpec:
    if isinstance(v.type, RuntimeType):
        return ValueSpec(v.name, "runtime", v.type.dtype, lo=v.type.lo, hi=v.type.hi)
    return ValueSpec(v.name, "tensor", v.type.dtype, shape=tuple(v.type.shape))


def schedule_steps(module: Module) -> tuple[ScheduleStep, ...]:
    return tuple(ScheduleStep(s.name, tuple(s.args), thaw(s.attrs))
                 for sched in module.find(Op.SCHEDULE) for s in sched.body)


def runtime_settings(module: Module) -> tuple[RuntimeSetting, ...]:
    out = []
    for n in module.find(Op.RUNTIME):
        v = value_spec(n.results[0])
        out.append(RuntimeSetting(v.name, v.kind, v.dtype, v.shape, v.lo, v.hi,
                                  default=n.attrs.get("default"), doc=n.attrs.get("doc")))
    return tuple(out)


def manifest_entry(node: Node, view: Node, ranks: list[RankFiles], **extra: Any) -> Component:
    """The manifest entry of a compiled program; its signature is `view`'s (the probe's pruned view)."""
    return Component(role=str(node.attrs.get("role")), cls=str(node.attrs.get("class")),
                     cache_key=node.attrs["cache_key"], ranks=tuple(ranks),
                     inputs=tuple(value_spec(n.results[0]) for n in view.find(Op.INPUT)),
                     outputs=tuple(value_spec(n.results[0]) for n in view.find(Op.OUTPUT)), **extra)


def program_paths(name: str, rank: int = 0) -> tuple[str, str]:
    return f"programs/{name}.rank{rank}.pt2", f"weights/{name}.rank{rank}.safetensors"


@dataclass
class Artifacts:
    root: Path
    manifest: Manifest
    module: Module
    host_dir: Path
    programs: dict[str, Program] = field(default_factory=dict)  # the schedule's components
    probe: Any = None  # the step-caching probe (a ProbeProgram), if the manifest has one

    def sizes(self) -> list[tuple[str, Module, dict[str, Any]]]:
        """(size, single-size module, programs by component name) per served size, default first;
        a size-independent program is the same object in every size."""
        from difflet.ir.buckets import SEP, views

        out = []
        for size, view in views(self.module):
            progs = {c.name: self.programs.get(f"{c.name}{SEP}{size}", self.programs.get(c.name))
                     for c in view.components()}
            out.append((size, view, progs))
        return out


def eager_programs(module: Module, ckpt_dir: str | os.PathLike) -> dict[str, Program]:
    """The uncompiled program modules, one per component, with the same call convention as ART's."""
    from difflet.codegen.build import build_program_module

    return {c.name: Program(c, build_program_module(c, ckpt_dir)) for c in module.components()}


def _check_hash(root: Path, ref: FileRef, what: str) -> Path:
    path = root / ref.path
    if not path.is_file():
        raise DiffletError(f"{what} is missing", where=path)
    got = sha256_file(path)
    if got != ref.sha256:
        raise DiffletError(f"{what} is corrupt or was modified: sha256 {got[:12]}... but the manifest "
                           f"records {ref.sha256[:12]}...", where=path)
    return path


def _node_of(root: Path, module: Module, name: str, entry: Component) -> Node:
    """The IR node a manifest entry was compiled from (a component, or the probe node)."""
    if entry.role == PROBE_ROLE:
        from difflet.codegen.probe import probe_node

        node = probe_node(module)
        if node is not None and node.name == name:
            return node
    else:
        try:
            return module.component(name)
        except KeyError:
            pass
    raise DiffletError(f"manifest lists {entry.role} {name!r} that module.ir does not have",
                       where=root / MANIFEST)


def _load_entry(root: Path, manifest: Manifest, node: Node, name: str, entry: Component, verify: bool,
                shared: dict | None = None):
    """One entry's loaded program, checked (cache key, every rank's files) when `verify`; bucket
    programs take their checkpoint tensors from `shared` (path -> tensors, loaded once)."""
    from difflet.codegen.backends import load_runner

    if verify:
        if entry.cache_key != node.attrs.get("cache_key"):
            raise DiffletError(f"program of {name!r} was built for cache key {entry.cache_key[:12]}... "
                               f"but module.ir says {str(node.attrs.get('cache_key'))[:12]}...; "
                               "re-run `difflet codegen`", where=root / entry.ranks[0].program.path)
        labelled = ([(f" ({entry.branch_input}={b.value})", b.files) for b in entry.branches] if entry.branches
                    else [(f" ({p.part}, rank {r})", f) for p in entry.parts for r, f in enumerate(p.ranks)]
                    if entry.parts
                    else [(f" (rank {r})" if entry.world > 1 else "", f) for r, f in enumerate(entry.ranks)])
        for which, files in labelled:
            _check_hash(root, files.program, f"program of {name!r}{which}")
            _check_hash(root, files.weights, f"weights of {name!r}{which}")
            if files.constants is not None:
                _check_hash(root, files.constants, f"constants of {name!r}{which}")
    if entry.cfg > 1:
        from difflet.codegen.cfg_program import cfg_program

        return cfg_program(node, manifest.backend, [root / f.program.path for f in entry.ranks],
                           [root / f.weights.path for f in entry.ranks])
    if entry.parts:
        from difflet.codegen.block_programs import load_parts

        return load_parts(root, manifest, node, name, entry, verify, shared)
    if entry.world > 1:
        from difflet.codegen.split_codegen import split_program

        return split_program(node, manifest.backend, [root / f.program.path for f in entry.ranks],
                             [root / f.weights.path for f in entry.ranks])
    if entry.branches:
        return _load_branches(root, manifest, node, name, entry, verify, shared)
    files = entry.ranks[0]
    if files.constants is None:
        return load_runner(manifest.backend, root / files.program.path, root / files.weights.path)
    shared = shared if shared is not None else {}
    # sizes whose programs are the same (FLUX at WxH and HxW: equal token counts) share one runner
    same = ("runner", files.program.sha256, files.weights.sha256, files.constants.sha256)
    if same not in shared:
        shared[same] = load_runner(manifest.backend, root / files.program.path, root / files.weights.path,
                                   root / files.constants.path, shared)
    return shared[same]


def load_artifacts(root: str | os.PathLike, verify: bool = True) -> Artifacts:
    """Load ART/: manifest, planned module, host dir and one loaded program per manifest entry (a
    split component: a SplitProgram whose rank workers run until `.close()` or exit; a cfg2
    component: a CfgProgram over two such replicas of its inner program; the probe:
    a ProbeProgram in `.probe`)."""
    from difflet.ir import binary

    root = Path(root)
    manifest = read_manifest(root)
    module_path = _check_hash(root, manifest.module, "module IR") if verify else root / manifest.module.path
    module = binary.load(module_path)
    art = Artifacts(root, manifest, module, root / manifest.host)
    shared: dict = {}  # shared weight files of bucket programs, loaded once
    for name, entry in manifest.components.items():
        node = _node_of(root, module, name, entry)
        loaded = _load_entry(root, manifest, node, name, entry, verify, shared)
        if entry.role == PROBE_ROLE:
            from difflet.codegen.probe import ProbeProgram

            art.probe = ProbeProgram(node, loaded)
        else:
            art.programs[name] = loaded if (entry.world > 1 and not entry.parts) or entry.cfg > 1 \
                else Program(node, loaded)
    return art


def _load_branches(root: Path, manifest: Manifest, node: Node, name: str, entry: Component, verify: bool,
                   shared: dict | None):
    """A branch set as one runner (codegen/branches.py): each branch's program over the shared
    weights file, loaded once; every branch's key checked against the component's."""
    from difflet.codegen.backends import load_runner
    from difflet.codegen.branches import BranchRunner, branch_key

    names = [n.name for n in node.find(Op.INPUT)]
    if entry.branch_input not in names:
        raise DiffletError(f"branch input {entry.branch_input!r} of {name!r} is not an input of module.ir's "
                           "component", where=root / MANIFEST)
    shared = shared if shared is not None else {}
    runners = {}
    for branch in entry.branches:
        if verify and branch.cache_key != branch_key(entry.cache_key, entry.branch_input, branch.value):
            raise DiffletError(f"branch program {entry.branch_input}={branch.value} of {name!r} does not belong "
                               "to the component's cache key; re-run `difflet codegen`",
                               where=root / branch.files.program.path)
        files = branch.files
        runners[branch.value] = load_runner(manifest.backend, root / files.program.path, root / files.weights.path,
                                            root / files.constants.path, shared)
    return BranchRunner(names.index(entry.branch_input), runners)

