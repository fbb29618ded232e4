"""Per-family codegen hooks: what a model family adds to the shared compile-and-load path.

A family module `difflet.codegen.family.<family>` (optional; torch may be imported lazily) may define:
- PIPELINE_CLASS: str — the diffusers pipeline `_class_name` written to a materialized
  checkpoint's model_index.json (the class the reference pipeline is loaded with).
- INDEX_EXTRAS: dict — extra model_index.json entries (optional components as [None, None]).
- PROCESSORS: {"diffusers.<Class>": processor class} — Difflet attention processors installed on
  the IR's `attention` sites (see codegen/attention.py for the contract).
- PROGRAM_WRAPPERS: {"<library>.<Class>": fn(model, node) -> torch.nn.Module} — adapts a loaded
  component to the program calling convention (IR inputs in, IR outputs out) when the generic
  ProgramModule cannot (e.g. a mask built inside the program from a runtime valid-text count).
- build_random(comp, config) -> model | None — a random model for a materialized checkpoint when
  the generic `cls(config)` does not fit (None = use the generic path).
- write_tokenizer(comp, config, tokenizer_attrs, dest) -> bool — write a tiny tokenizer for a
  materialized checkpoint (False = use the generic word-level tokenizer).

Invariant: hooks only adapt; compiling, storing, loading and serving stay the shared code.
"""
from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

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
    """Merge `attr` (PROCESSORS or PROGRAM_WRAPPERS) over every family that has a hook module."""
    merged: dict = {}
    for family in FAMILIES:
        hooks = family_hooks(family)
        if hooks is not None:
            merged.update(getattr(hooks, attr, {}))
    return merged
