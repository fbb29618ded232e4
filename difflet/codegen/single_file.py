"""Single-file components: a component's weights as one file in its original layout (e.g. Black
Forest Labs' `flux1-dev.safetensors`, a ComfyUI file with `model.diffusion_model.` keys) served
next to a diffusers-format directory for the rest.

Invariants:
- The conversion is diffusers' own: `<Class>.from_single_file(FILE, config=DIR, subfolder=SUB)`
  (it detects the layout and maps the keys); this module names no family and holds no key map.
  The class is the IR node's (`attrs["class"]`); a class without `from_single_file` is an error.
- A file is converted once: the converted folder (save_pretrained) is a store entry keyed by the
  file's path, size and mtime, the class, SUB/config.json, the dtype and the diffusers version.
  The result is an ordinary checkpoint directory (another store entry: symlinks to DIR's other
  entries, the converted folder in SUB's place), so everything downstream is unchanged.
- One log line per conversion, none when the store has it; failures are one-line DiffletErrors
  naming the file. torch is imported inside functions only.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Node

# Bump when a converted entry or an assembled directory is written differently (store keys).
SINGLE_FILE_VERSION = 1


def parse_component_files(items: list[str] | tuple[str, ...], where: str = "--component-file") -> dict[str, str]:
    """["transformer=/x/flux1-dev.safetensors", ...] -> {"transformer": "/x/flux1-dev.safetensors"}."""
    files: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise DiffletError(f"{item!r} is not NAME=PATH (e.g. transformer=flux1-dev.safetensors)", where=where)
        if name.strip() in files:
            raise DiffletError(f"component {name.strip()!r} is given twice", where=where)
        files[name.strip()] = path.strip()
    return files


def _component(module: Module, name: str) -> Node:
    for comp in module.components():
        if comp.name == name:
            return comp
    known = ", ".join(c.name for c in module.components())
    raise DiffletError(f"{name!r} is not a component of the model (components: {known}; a single file "
                       "is given as COMPONENT=PATH)", where=name)


def _file_stamp(path: Path) -> list[Any]:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def _tree_stamp(root: Path) -> list[Any]:
    """Sizes and times of a checkpoint directory's files (a changed file changes the key)."""
    return [str(root.resolve()), sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
                                        for p in root.rglob("*") if p.is_file())]


def _key(parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _one_line(err: BaseException) -> str:
    text = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return f"{type(err).__name__}: {text[:300]}"


def _convert(node: Node, cls: type, file: Path, base: Path, sub: str, dest: Path, verbose: bool) -> None:
    import torch

    from difflet.codegen.quiet import quiet_libraries

    dtype = getattr(torch, node.attrs.get("dtype", "float32"))
    try:
        with quiet_libraries(verbose):
            model = cls.from_single_file(str(file), config=str(base), subfolder=sub, torch_dtype=dtype,
                                         local_files_only=True)
    except Exception as err:  # diffusers raises many kinds (layout not detected, shapes, I/O)
        raise DiffletError(f"cannot convert {file.name} into {node.attrs['class']} for component "
                           f"{node.name!r}: {_one_line(err)}", where=str(file)) from None
    model.save_pretrained(str(dest), safe_serialization=True)


def _assemble(base: Path, replaced: Mapping[str, Path], dest: Path) -> None:
    """dest/: a symlink to each entry of base, the converted folders in their subfolders' place."""
    for entry in sorted(base.iterdir()):
        if entry.name not in replaced:
            os.symlink(entry.resolve(), dest / entry.name)
    for sub, folder in replaced.items():
        os.symlink(folder.resolve(), dest / sub)


def with_component_files(module: Module, weights: str, files: Mapping[str, str | os.PathLike],
                         store_root: str | os.PathLike | None = None,
                         log: Callable[[str], Any] = print, verbose: bool = False) -> Path:
    """The checkpoint directory `weights` (a directory, hf:ORG/NAME or random:SEED) with each
    component NAME in `files` taken from its single file (converted once into the store);
    `verbose` keeps diffusers' own warnings and bars while converting."""
    import diffusers

    from difflet.codegen.checkpoint import resolve_class, resolve_weights
    from difflet.codegen.store import Store
    from difflet.ir.buckets import views

    base = resolve_weights(module, weights, store_root)
    module = views(module)[0][1]  # a bucketed module's sizes share the checkpoint's components
    store = Store(store_root)
    replaced: dict[str, Path] = {}
    for name, file in sorted(files.items()):
        node = _component(module, name)
        if not isinstance(file, (str, os.PathLike)):
            raise DiffletError(f"{name}=: a path to a single file is served, not a {type(file).__name__}",
                               where=name)
        path = Path(file)
        if not path.is_file():
            raise DiffletError(f"single file for component {name!r} does not exist", where=str(path))
        cls = resolve_class(node.attrs["class"], node.loc)
        if not hasattr(cls, "from_single_file"):
            raise DiffletError(f"component {name!r}: {node.attrs['class']} has no from_single_file, so it "
                               "cannot load a single file; give its diffusers-format folder in the "
                               "checkpoint directory instead", where=str(path))
        sub = node.attrs.get("subfolder", node.name)
        config = base / sub / "config.json"
        if not config.is_file():
            raise DiffletError(f"component {name!r}: converting {path.name} needs the component's config "
                               f"({sub}/config.json) in the checkpoint directory", where=str(config))
        key = _key([SINGLE_FILE_VERSION, _file_stamp(path), node.attrs["class"], config.read_text(),
                    node.attrs.get("dtype", "float32"), diffusers.__version__])

        def produce(tmp: Path, node=node, cls=cls, path=path, sub=sub) -> None:
            log(f"converting {path} into the store ({node.attrs['class']}, component {node.name!r}) ...")
            _convert(node, cls, path, base, sub, tmp, verbose)

        replaced[sub], _ = store.get_or_create("single-file", key, produce, directory=True)
    key = _key([SINGLE_FILE_VERSION, _tree_stamp(base), {s: str(p) for s, p in sorted(replaced.items())}])
    path, _ = store.get_or_create("single-file-checkpoints", key,
                                  lambda tmp: _assemble(base, replaced, tmp), directory=True)
    return path
