"""Generic codegen's view of the families' class declarations (codegen/decl.py), merged over the
family registry: the one codegen module that reaches a family's programs.py.

Invariant: families never import this module (their programs.py imports only leaves), so the
registry's lazy imports close no import loop (tests/test_structure.py follows them).
"""
from __future__ import annotations

import functools

from difflet.codegen.decl import NONE, ClassDecl


def class_registry(attr: str) -> dict:
    """Merge the dict `attr` (CLASSES, FP32_ROPE) over every family's programs.py, in registry order."""
    from difflet.families import FAMILIES, programs

    merged: dict = {}
    for family in FAMILIES:
        merged.update(getattr(programs(family), attr, {}))
    return merged


@functools.cache
def _declarations() -> dict[str, ClassDecl]:
    return class_registry("CLASSES")


def declaration(cls: str) -> ClassDecl:
    """The declaration of a qualified class name (an empty one when no family declares it)."""
    return _declarations().get(cls, NONE)


def declared(field_name: str) -> list[str]:
    """The classes whose declaration sets `field_name` (for messages and consistency checks)."""
    return [c for c, d in _declarations().items() if getattr(d, field_name) is not None]
