"""ART/manifest.json as typed structs: the one definition codegen writes and every reader decodes.

Invariants:
- Torch-free (msgspec and the standard library only): the API process reads manifests and never
  imports torch (tests/test_codegen_manifest.py checks the import).
- Decoding is strict: an unknown field, a missing field, a wrong type or another format version
  is a DiffletError naming manifest.json and the field's path (`$.components.vae.cache_key`),
  never a KeyError later; `FORMAT_VERSION` changes whenever the layout does.
- Every compiled program is a `components` entry, the step-caching probe included (role
  "probe", `source` the component it is cut from): one load path for all programs.
- Every entry lists its files per rank (`ranks[r]`, rank r's program and weights); an unsplit
  program has exactly one rank. A branch set (`branches`, one program per value of the runtime
  input `branch_input`) is one rank too, the first branch's files. A block-mode denoiser
  (`parts`: front and rest, `front_blocks` its cut) lists the front's rank files as its `ranks`. A cfg2 entry (`cfg` 2) lists its inner layout's ranks once
  (`world`, `degrees`: the inner layout's); both cfg groups load the same files. Paths are relative to ART/ (ART is self-contained).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Literal

import msgspec

from difflet.errors import DiffletError

# 2: probe under components with role "probe"; per-rank files for every entry
# 3: shape buckets (`buckets`; per-size entries NAME@SIZE whose `weights` file is shared by every
#    size of the component and whose graph-made constants are their own `constants` file)
# 4: branch programs (`branch_input`, `branches`: one program per value of a runtime input)
# 5: block programs (`front_blocks`, `parts`: a denoiser's front and rest over one weights file)
FORMAT_VERSION = 5
MANIFEST = "manifest.json"
MODULE_FILE = "module.ir"
PROBE_ROLE = "probe"


class _Strict(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, frozen=True):
    pass


class FileRef(_Strict):
    path: str  # relative to ART/
    sha256: str


class RankFiles(_Strict):
    program: FileRef
    weights: FileRef
    constants: FileRef | None = None  # bucket programs: the graph-made constants, apart from `weights`


class ValueSpec(_Strict):
    """A program input or output: a tensor (shape) or a runtime value (0-d, range [lo, hi])."""

    name: str
    kind: Literal["tensor", "runtime"]
    dtype: str
    shape: tuple[int, ...] | None = None
    lo: int | None = None
    hi: int | None = None


class RuntimeSetting(ValueSpec):
    """A module-level runtime value with its default and documentation."""

    default: Any = None
    doc: str | None = None


class ScheduleStep(_Strict):
    step: str
    args: tuple[str, ...]
    attrs: dict[str, Any]


class Branch(_Strict):
    """The program of a branch set compiled for `branch_input` = `value` (codegen/branches.py)."""

    value: int
    cache_key: str
    files: RankFiles  # `weights` is shared by every branch; `constants`: this program's own


class Part(_Strict):
    """One program of a denoiser cut into block mode's front and rest (codegen/block_programs.py)."""

    part: Literal["front", "rest"]
    cache_key: str  # a split part's rank r program is the store entry rank_key(cache_key, r, world)
    ranks: tuple[RankFiles, ...]  # rank r's `weights` are shared by both parts; `constants`: its own
    inputs: tuple[ValueSpec, ...]  # the IR's, then the part's extra ones
    outputs: tuple[ValueSpec, ...]


class Component(_Strict):
    """One compiled program (per rank) and how it is called."""

    role: str
    cls: str = msgspec.field(name="class")
    cache_key: str
    ranks: tuple[RankFiles, ...]
    inputs: tuple[ValueSpec, ...]
    outputs: tuple[ValueSpec, ...]
    world: int = 1
    degrees: dict[str, int] = {}  # split programs: the layout's degrees (tp, cp, ...)
    cfg: int = 1  # > 1: `ranks` are the inner layout's programs, run as cfg replicas (one per pass)
    source: str | None = None  # the probe: the component it is cut from
    branch_input: str | None = None  # one program per value of this runtime input: `branches`
    branches: tuple[Branch, ...] = ()  # `ranks[0]` is the first branch's files
    front_blocks: int = 0  # > 0: `parts` are the front (its first front_blocks blocks) and the rest
    parts: tuple[Part, ...] = ()  # `ranks[0]` is the front's files

    def __post_init__(self) -> None:
        if len(self.ranks) != self.world:  # raised as a ValidationError naming the entry
            raise ValueError(f"`world` is {self.world} but `ranks` lists {len(self.ranks)} rank files")
        if (self.branch_input is None) != (not self.branches) or \
                (self.branches and (self.world != 1 or self.ranks[0] != self.branches[0].files)):
            raise ValueError("`branch_input` and `branches` go together, on one rank whose files are "
                             "the first branch's")
        if (self.front_blocks > 0) != bool(self.parts) or (self.parts and (
                [p.part for p in self.parts] != ["front", "rest"] or self.ranks != self.parts[0].ranks
                or len(self.parts[1].ranks) != self.world)):
            raise ValueError("`front_blocks` > 0 and `parts` (front, rest) go together, each with `world` "
                             "rank files, the front's being `ranks`")


class Versions(_Strict):
    torch: str
    difflet: str


class Manifest(_Strict):
    format: int
    model: str
    family: str
    profile: dict[str, Any]
    parallel: dict[str, Any]
    target: str
    backend: str
    versions: Versions
    module: FileRef
    host: str
    host_files: dict[str, str]
    weights_source: str
    components: dict[str, Component]
    runtime: tuple[RuntimeSetting, ...] = ()
    schedule: tuple[ScheduleStep, ...] = ()
    buckets: tuple[str, ...] = ()  # the served sizes ("WxH" / "WxHxF"); () = the profile's size only

    def programs(self) -> dict[str, Component]:
        """The schedule's components (every entry but the probe)."""
        return {n: c for n, c in self.components.items() if c.role != PROBE_ROLE}

    @property
    def sizes(self) -> tuple[str, ...]:
        """Every served size, the default (the profile's) first (batch buckets left out)."""
        from difflet.ir.buckets import served_sizes, size_of

        return served_sizes(self.buckets) if self.buckets else (size_of(self.profile),)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The compiled batch sizes of the batch-dependent programs, ascending; (1,) if none."""
        from difflet.ir.buckets import batch_sizes

        return batch_sizes(self.buckets)

    @property
    def probe(self) -> tuple[str, Component] | None:
        """(name, entry) of the step-caching probe, or None."""
        return next(((n, c) for n, c in self.components.items() if c.role == PROBE_ROLE), None)


class _FormatOnly(msgspec.Struct):
    format: Any = None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_ref(root: Path, rel: str) -> FileRef:
    return FileRef(rel, sha256_file(root / rel))


def decode_manifest(data: bytes, where: Path) -> Manifest:
    """Strict decode of manifest bytes; DiffletError naming `where` and the offending field."""
    try:
        version = msgspec.json.decode(data, type=_FormatOnly).format
    except msgspec.DecodeError as err:  # not JSON, or not an object
        raise DiffletError(f"manifest is not a JSON object: {err}", where=where) from None
    if version != FORMAT_VERSION:
        raise DiffletError(f"manifest format {version!r} is not {FORMAT_VERSION} (written by another "
                           "Difflet version); re-run `difflet codegen`", where=where)
    try:
        return msgspec.json.decode(data, type=Manifest)
    except msgspec.ValidationError as err:  # msgspec names the field: "... - at `$.module.sha256`"
        raise DiffletError(f"manifest is malformed: {_component_error(data) or err}; re-run `difflet codegen`",
                           where=where) from None


def _component_error(data: bytes) -> str | None:
    """The first bad component's error with its name in the path (msgspec writes dict keys as
    `[...]`), or None when every component decodes."""
    components = msgspec.json.decode(data).get("components")
    for name, raw in (components.items() if isinstance(components, dict) else ()):
        try:
            msgspec.convert(raw, Component)
        except msgspec.ValidationError as err:
            text, at = str(err), f"`$.components.{name}"
            return text.replace("`$", at, 1) if "`$" in text else f"{text} - at {at}`"
    return None


def read_manifest(root: str | os.PathLike) -> Manifest:
    """ART/manifest.json, decoded strictly (see module invariants)."""
    root = Path(root)
    path = root / MANIFEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DiffletError("not an artifact directory (no manifest.json); run `difflet codegen`",
                           where=root) from None
    return decode_manifest(data, path)


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Write ART/manifest.json atomically (a directory with a manifest is a finished ART)."""
    tmp = root / f".{MANIFEST}.tmp"
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(manifest), indent=2))
    os.replace(tmp, root / MANIFEST)
