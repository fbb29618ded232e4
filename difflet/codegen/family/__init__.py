"""The family registry: what each model family adds to the shared compile-and-load path.

A family module `difflet.codegen.family.<family>` (one per name in FAMILIES; torch may be
imported lazily) declares:
- CLASSES: {"<library>.<Class>": ClassDecl} — one declaration per class the family owns
  (family/decl.py: attention processors, program wrapper, split and probe facts, random-build
  and tokenizer hooks), as data;
- PIPELINE_CLASS: str — the diffusers pipeline `_class_name` of a materialized checkpoint's
  model_index.json; INDEX_EXTRAS: dict — extra model_index.json entries;
- FP32_ROPE (optional): {"<submodule class name>": fn(module) -> bool} — replaces a float64
  RoPE computation (difflet/codegen/rope.py), True when it replaced it.

Invariants: hooks only adapt; compiling, storing, loading and serving stay the shared code.
Adding a family is its own modules plus one name in FAMILIES. Generic codegen reaches family
modules only through this registry, by name (importlib), so no generic module imports one.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
from types import ModuleType

from difflet.codegen.family.decl import NONE, ClassDecl

FAMILIES = ("flux", "qwen_image", "wan", "hunyuan_video", "ltx2")


def family_hooks(family: str | None) -> ModuleType | None:
    """The family's hook module, or None when the family has none."""
    if not family:
        return None
    name = f"{__name__}.{family}"
    if importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name)


def class_registry(attr: str) -> dict:
    """Merge the dict `attr` (CLASSES, FP32_ROPE) over every family module, in FAMILIES order."""
    merged: dict = {}
    for family in FAMILIES:
        hooks = family_hooks(family)
        if hooks is not None:
            merged.update(getattr(hooks, attr, {}))
    return merged


@functools.cache
def _declarations() -> dict[str, ClassDecl]:
    return class_registry("CLASSES")


def declaration(cls: str) -> ClassDecl:
    """The declaration of a qualified class name (an empty one when no family declares it)."""
    return _declarations().get(cls, NONE)


def declared(field: str) -> list[str]:
    """The classes whose declaration sets `field` (for messages and consistency checks)."""
    return [c for c, d in _declarations().items() if getattr(d, field) is not None]
