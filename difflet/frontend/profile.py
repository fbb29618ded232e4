"""The serving profile: the DSL's `profile { ... }` defaults with command-line overrides applied.

Invariants:
- The result keeps the DSL's parameter order; overrides replace values, never add keys.
- An override takes the type of the default it replaces: an integer default accepts only an
  integer, a float default a number, a bool `true`/`false`, a word/string any identifier; a
  default naming another parameter (an alias) takes its target's type or another parameter's name.
- A bad override is reported at the DSL parameter it targets (or the model header for an
  unknown key), with the offending `key=value` as snippet.
"""
from __future__ import annotations

import re
from typing import Any

from difflet.errors import DiffletError
from difflet.frontend import ast
from difflet.frontend.shapes import Source, resolved

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")


def parse_profile_arg(text: str) -> dict[str, str]:
    """`height=1024,width=1024` -> {"height": "1024", "width": "1024"} (CLI `--profile`)."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise DiffletError(f"--profile expects key=value[,key=value...], got {part!r}",
                               where="--profile", snippet=text)
        out[key.strip()] = value.strip()
    return out


def defaults(src: Source, model: ast.ModelDecl) -> dict[str, Any]:
    """The profile as written in the DSL (duplicate names are an error)."""
    profile: dict[str, Any] = {}
    for p in model.params:
        if p.name in profile:
            raise src.error(f"duplicate profile parameter {p.name!r}", p.span)
        v = p.value
        profile[p.name] = v.value if isinstance(v, (ast.Num, ast.Lit)) else v.name
    return profile


def apply_overrides(src: Source, model: ast.ModelDecl, overrides: dict[str, str]) -> dict[str, Any]:
    profile = defaults(src, model)
    spans = {p.name: p.span for p in model.params}
    for key, raw in overrides.items():
        if key not in profile:
            known = ", ".join(profile) or "none"
            raise DiffletError(f"--profile: unknown profile parameter {key!r} (known: {known})",
                               where=src.loc(model.span), snippet=f"{key}={raw}")
        alias = isinstance(profile[key], str) and profile[key] in profile  # `image_width = width`
        if alias and raw in profile:
            profile[key] = raw
        else:  # an alias takes its target's type
            profile[key] = _coerce(src, key, raw, resolved(profile, key) if alias else profile[key], spans[key])
    return profile


def derive_profile(profile: dict[str, Any], overrides: dict[str, str], configs: dict, components, derive) -> None:
    """Replace in `profile` the values the family derives from others and the components' configs
    (`derive`: FamilyFacts.derived_profile, given class -> config), except those in `overrides`."""
    by_class = {c.qualname: configs[c.name].to_python() for c in components if configs[c.name] is not None}
    derived = derive(dict(profile), by_class)
    profile.update({k: v for k, v in derived.items() if k in profile and k not in overrides})


def _coerce(src: Source, key: str, raw: str, default: Any, span: ast.Span) -> Any:
    def bad(kind: str) -> DiffletError:
        return DiffletError(f"--profile {key}={raw!r}: expected {kind} like the default {default!r}",
                            where=src.loc(span), snippet=f"{key}={raw}")

    if isinstance(default, bool):
        if raw not in ("true", "false"):
            raise bad("true or false")
        return raw == "true"
    if isinstance(default, int):
        if not re.fullmatch(r"[+-]?\d+", raw):
            raise bad("an integer")
        return int(raw)
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError:
            raise bad("a number") from None
    if not _WORD.match(raw):
        raise bad("a word")
    return raw
