"""cache-key: an explicit, auditable sha256 per compiled component.

Inputs (exactly these, written out by `key_inputs`, printed by `difflet opt --explain-key`):
the component's class, config, family options, entry, dtype and probe attrs; its input/output names and
types (shapes, dtypes, runtime ranges) with their select/alias/state attrs; its attention
sites; its planned layout node (attrs and body; for a world-1 layout without its placement:
ranks, replicas and groups read as one copy on rank 0); the backend; the toolchain's versions
(`compiler_version`: the backend's compiler and toolchain packages, plus torch and the model
libraries whose classes a program is traced from, diffusers and transformers); the Difflet version, which includes a digest of the source that decides what a program computes
(codegen, parallel, difflet/kernels and the families but for their host steps), so editing a processor or program wrapper
never reuses a stale program; whether a probe is carried.
A world-1 program is the same program wherever and however often it is placed, so a TP1
encoder keys (and compiles) the same in a tp1 and a tp2cp2 plan; a split layout keeps its
placement, which its rank programs' collectives depend on.
A backend with compiler flags adds them as a separate named part (its declaration's `key_part`,
passes/backend_facts.py; neuron: "neuron_compiler_args", the target table's neuronx-cc flags), since
flags change the emitted program.
Never inputs: runtime settings (cache mode, threshold, cadence, steps, guidance, seed),
weights (or params counts and subfolders, which name them), tokenizers (host side) and
source locations. So changing a runtime setting recompiles nothing.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
from pathlib import Path
from typing import Any

import msgspec

from difflet.ir.nodes import Attrs, Module, Node, Op, RuntimeType, TensorType
from difflet.passes import model_facts as F
from difflet.passes.backend_facts import BACKENDS

KEY_ATTRS = ("role", "class", "config", "options", "entry", "dtype", "probe", "mode", "source", "modules",
             "stops_before", "score", "fused_into", "front_blocks")


def package_version(dist: str) -> str:
    """The installed version of `dist`, without importing it; "absent" if not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


# what every program is traced from, whatever the backend: an upgrade of one changes the classes'
# forward code (diffusers, transformers) or the export (torch), so it must miss the store
MODEL_LIBRARIES = ("torch", "diffusers", "transformers")


def compiler_version(backend: str) -> str:
    """`PACKAGE==VERSION ...` of the backend's compiler first (an undeclared name stands for its own
    package), then its toolchain and MODEL_LIBRARIES, each once."""
    facts = BACKENDS.get(backend)
    dists = (facts.compiler, *facts.toolchain) if facts is not None else (backend,)
    dists = tuple(dict.fromkeys((*dists, *MODEL_LIBRARIES)))
    return " ".join(f"{d}=={package_version(d)}" for d in dists)


def flags_part(backend: str, target: str | None) -> dict[str, Any]:
    """The backend's compiler-flags key part for `target` ({} for a backend without flags)."""
    return BACKENDS[backend].key_part(target) if backend in BACKENDS else {}


# Source trees (relative to the directory holding the difflet package) that programs are built
# from; a family's host steps (families/<family>/host.py) run on the host only and are left out.
PROGRAM_SOURCES = ("difflet/codegen", "difflet/parallel", "difflet/kernels", "difflet/families")
HOST_ONLY = "host.py"


@functools.lru_cache(maxsize=4)
def program_source_digest(root: Path | None = None) -> str:
    """12 hex digits over the .py/.cpp files of PROGRAM_SOURCES under `root` (default: where
    difflet is installed), path and bytes, in sorted order."""
    root = root or Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for tree in PROGRAM_SOURCES:
        for path in sorted((root / tree).rglob("*")):
            if path.suffix in (".py", ".cpp") and path.is_file() and path.name != HOST_ONLY:
                h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def difflet_version() -> str:
    v = package_version("difflet")
    if v == "absent":
        from difflet.version import __version__ as v
    return f"{v}+src.{program_source_digest()}"


def _plain(v: Any) -> Any:
    if isinstance(v, Attrs):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, TensorType):
        return {"tensor": v.dtype, "shape": list(v.shape)}
    if isinstance(v, RuntimeType):
        return {"runtime": v.dtype, "lo": v.lo, "hi": v.hi}
    return v


def _node(n: Node) -> dict:
    """A node without its source location."""
    return {"op": n.op.value, "name": n.name, "attrs": _plain(n.attrs), "args": list(n.args),
            "results": [{"name": r.name, "type": _plain(r.type)} for r in n.results],
            "body": [_node(b) for b in n.body]}


def _unplaced(layout: dict) -> dict:
    """A world-1 layout's key form: placement normalized to the single-rank plan's values (so a
    tp1 plan's keys are exactly what they were before placement was left out)."""
    a = layout["attrs"]
    if a.get("world", 1) != 1:
        return layout
    a.update({k: v for k, v in (("ranks", [0]), ("replicas", 1)) if k in a})
    if "groups" in a:
        a["groups"] = {axis: [[0]] for axis in a["groups"]}
    return layout


def key_inputs(comp: Node, backend: str, compiler: str, difflet: str, probe: str) -> dict:
    """Everything the key hashes, as plain JSON-able data, in a fixed order."""
    kept = (Op.INPUT, Op.OUTPUT, Op.ATTENTION, Op.LAYOUT)
    return {
        "component": comp.name,
        "attrs": {k: _plain(comp.attrs[k]) for k in KEY_ATTRS if k in comp.attrs},
        "body": [_unplaced(_node(n)) if n.op == Op.LAYOUT else _node(n) for n in comp.body if n.op in kept],
        "backend": backend,
        "compiler": compiler,
        "difflet": difflet,
        "probe": probe,
    }


def digest(inputs: dict) -> str:
    text = json.dumps(inputs, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def probe_presence(m: Module, comp: Node) -> str:
    """How this component carries the probe: none | separate | fused."""
    if comp.attrs.get("role") == "probe":
        return comp.attrs.get("mode", "separate")
    return "fused" if comp.attrs.get("probe") == "fused" else "none"


def assign_cache_keys(m: Module, backend: str, compiler: str, difflet: str | None = None) -> Module:
    """Set attrs cache_key (and record backend/compiler/difflet versions on the module)."""
    difflet = difflet or difflet_version()
    body = [_keyed(m, n, backend, compiler, difflet) if n.op in (Op.COMPONENT, Op.PROBE) else n for n in m.body]
    attrs = m.attrs.set(backend=backend, compiler=compiler, difflet_version=difflet)
    return msgspec.structs.replace(m, attrs=attrs, body=tuple(body))


def _keyed(m: Module, n: Node, backend: str, compiler: str, difflet: str) -> Node:
    key = digest({**key_inputs(n, backend, compiler, difflet, probe_presence(m, n)),
                  **flags_part(backend, m.attrs.get("target"))})
    return msgspec.structs.replace(n, attrs=n.attrs.set(cache_key=key))


def keyed(m: Module, n: Node) -> Node:
    """`n` (a view of a component of keyed module `m`, e.g. a cfg denoiser's inner cond_view)
    with the cache key `assign_cache_keys` gives it: the same node in a plain plan keys the same."""
    return _keyed(m, n, m.attrs["backend"], m.attrs["compiler"], m.attrs["difflet_version"])


def explain(m: Module) -> str:
    """The key inputs of every component of a planned module, as indented JSON."""
    out = {}
    for comp in F.compiled(m):
        inputs = key_inputs(comp, m.attrs["backend"], m.attrs["compiler"], m.attrs["difflet_version"],
                            probe_presence(m, comp))
        inputs.update(flags_part(m.attrs["backend"], m.attrs.get("target")))
        out[comp.name] = {"cache_key": digest(inputs), "inputs": inputs}
    return json.dumps(out, indent=1)
