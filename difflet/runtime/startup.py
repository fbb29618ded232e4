"""Startup checks of an artifact directory against the serving profile, before any weight loads.

Run by the API process before it spawns a model process (first start and every replacement);
the model process then loads with `load_artifacts(verify=True)`, which checks every sha256 and
cache key. Nothing here imports torch, and nothing here (or anywhere in serving) compiles.

Invariants:
- manifest.json and module.ir must describe the same profile (model, family, profile values,
  parallel layout, target, backend); a manifest copied from another profile is refused naming
  the keys that differ, before the module hash check would give a vaguer "modified" message.
- Rank assignment: every component lists its rank files in order (rank r's program and weights
  are `*.rank<r>.*`) and never more ranks than the layout's world size.
- `expect` (from `--profile KEY=VALUE`) must match what the artifacts were compiled for.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from difflet.codegen.manifest import MANIFEST, Manifest, read_manifest, sha256_file
from difflet.errors import DiffletError

_RANK_RE = re.compile(r"\.rank(\d+)\.")


@dataclass(frozen=True)
class ArtifactInfo:
    root: Path
    manifest: Manifest  # decoded strictly (difflet/codegen/manifest.py, torch-free)
    module: Any  # difflet.ir.nodes.Module

    @property
    def profile(self) -> dict[str, Any]:
        return self.module.attrs["profile"].to_python()


def _py(value: Any) -> Any:
    return value.to_python() if hasattr(value, "to_python") else value


def compiled_for(manifest: Manifest) -> dict[str, str]:
    """Flat KEY -> text of what the artifacts were compiled for (what --profile compares)."""
    flat = {"model": manifest.model, "family": manifest.family, "target": manifest.target,
            "backend": manifest.backend, **manifest.profile, **manifest.parallel}
    return {k: str(v) for k, v in flat.items() if v is not None}


def _diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    return [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def check_manifest_matches_module(manifest: Manifest, module, where: Path) -> None:
    attrs = module.attrs
    pairs = {
        "model": (manifest.model, module.name),
        "family": (manifest.family, str(attrs.get("family", ""))),
        "target": (manifest.target, str(attrs.get("target", ""))),
        "backend": (manifest.backend, str(attrs.get("backend", manifest.backend))),
    }
    diffs = [f"{k}: manifest {m!r} vs module.ir {i!r}" for k, (m, i) in pairs.items() if m != i]
    diffs += [f"profile {d}" for d in _diff(manifest.profile, _py(attrs.get("profile")) or {})]
    diffs += [f"parallel {d}" for d in _diff(manifest.parallel, _py(attrs.get("parallel")) or {})]
    if diffs:
        raise DiffletError("manifest.json belongs to another profile than module.ir (manifest vs "
                           "module.ir: " + "; ".join(diffs) + "); re-run `difflet codegen`", where=where)


def check_rank_assignment(manifest: Manifest, where: Path) -> None:
    world = int(manifest.parallel.get("world", 1))
    for name, comp in manifest.components.items():
        if len(comp.ranks) > world:
            raise DiffletError(f"component {name!r} has {len(comp.ranks)} ranks but the layout's world "
                               f"size is {world}", where=where)
        for r, files in enumerate(comp.ranks):
            for kind in ("program", "weights"):
                path = getattr(files, kind).path
                found = _RANK_RE.search(path)
                if found is None or int(found.group(1)) != r:
                    raise DiffletError(f"component {name!r}: rank {r}'s {kind} file {path!r} is "
                                       f"assigned to another rank", where=where)


def check_expected(manifest: Manifest, expect: Mapping[str, str], where: Path) -> None:
    have = compiled_for(manifest)
    bad = [f"{k}={v} (compiled for {k}={have[k]})" if k in have else f"{k}={v} (unknown key; "
           f"known: {', '.join(sorted(have))})" for k, v in expect.items() if have.get(k) != str(v)]
    if bad:
        raise DiffletError("the artifacts do not match the serving profile: " + ", ".join(bad),
                           where=where)


def check_artifacts(root: str | Path, expect: Mapping[str, str] | None = None) -> ArtifactInfo:
    """All torch-free startup checks of ART/; raises DiffletError naming the file and the reason."""
    from difflet.ir import binary

    root = Path(root)
    if not root.is_dir():
        raise DiffletError("artifact directory does not exist", where=str(root))
    manifest = read_manifest(root)
    where = root / MANIFEST
    module_path = root / manifest.module.path
    if not module_path.is_file():
        raise DiffletError("module IR is missing", where=module_path)
    try:
        module = binary.load(module_path)
    except Exception as err:  # a damaged file: say so instead of a decoder traceback
        raise DiffletError(f"module IR cannot be read ({type(err).__name__}: {err})",
                           where=module_path) from None
    check_manifest_matches_module(manifest, module, where)
    got = sha256_file(module_path)
    if got != manifest.module.sha256:
        raise DiffletError(f"module IR is corrupt or was modified: sha256 {got[:12]}... but the "
                           f"manifest records {manifest.module.sha256[:12]}...", where=module_path)
    check_rank_assignment(manifest, where)
    check_expected(manifest, dict(expect or {}), where)
    return ArtifactInfo(root, manifest, module)


def text_limit(module) -> tuple[int, str]:
    """(token limit, encoder name): the longest text encoder's compiled max_length, less the
    profile's `template` tokens (Qwen-Image, HunyuanVideo wrap the prompt in a template that
    takes that many of the encoder's positions and is cut off before the denoiser). The
    `strict` prompt policy refuses past it; Profile.prompt_tokens reports it."""
    best = (0, "")
    for comp in module.components("encoder"):
        spec = comp.attrs.get("tokenizer")
        if spec is not None and int(spec["max_length"]) > best[0]:
            best = (int(spec["max_length"]), comp.name)
    template = int(module.attrs["profile"].get("template", 0)) if best[1] else 0
    return best[0] - template, best[1]
