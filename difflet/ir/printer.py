"""IR -> text (the form `difflet show` prints and `parser.parse_module` reads back).

Invariants:
- `parse_module(print_module(m)) == m` for every Module: every attr value type, both value
  types, runtime ranges, nested bodies and every `loc` survive exactly.
- One node per line; a body is wrapped in braces and indented by two spaces. Every node line
  ends with its `loc(...)`, which is what keeps attrs (before it) apart from a body (after it).
- Names that are not plain identifiers, or that are keywords, are printed quoted.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from difflet.ir.nodes import Attrs, Loc, Module, Node, RuntimeType, TensorType, Value

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
# quoted even though they lex as identifiers, so a hand edit can never make them keywords
_KEYWORDS = frozenset({"module", "level", "loc", "unknown", "runtime", "in", "true", "false",
                       "none", "inf", "nan", "tensor"})
_SURROGATE = re.compile("[\ud800-\udfff]")
# attrs longer than this on one line (configs, schedulers) print one key per line
WRAP_AT = 80


def quote(s: str) -> str:
    """A JSON-style string literal; lone surrogates are escaped so the text stays valid UTF-8."""
    text = json.dumps(s, ensure_ascii=False)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def word(s: str) -> str:
    """A bare identifier when it is one (and not a keyword), else a quoted string."""
    return s if _IDENT.match(s) and s not in _KEYWORDS else quote(s)


def format_value(v: Any) -> str:
    """One attribute value, on one line."""
    if v is None:
        return "none"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return repr(v)  # repr round-trips; it always has '.', 'e' or is 'inf'/'-inf'
    if isinstance(v, str):
        return quote(v)
    if isinstance(v, tuple):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    if isinstance(v, Attrs):
        return format_attrs(v)
    raise TypeError(f"not an attribute value: {v!r} ({type(v).__name__})")


def format_attrs(attrs: Attrs) -> str:
    return "{" + ", ".join(f"{word(k)} = {format_value(v)}" for k, v in attrs.items()) + "}"


def _wrapped_attrs(attrs: Attrs, indent: str) -> str:
    inner = indent + "    "
    lines = [f"{inner}{word(k)} = {format_value(v)}" for k, v in attrs.items()]
    return "{\n" + ",\n".join(lines) + "\n" + indent + "  }"


def _attrs_text(attrs: Attrs, indent: str) -> str:
    flat = format_attrs(attrs)
    return flat if len(flat) <= WRAP_AT else _wrapped_attrs(attrs, indent)


def format_type(t: Any) -> str:
    if isinstance(t, TensorType):
        dims = "".join(f"{d}x" for d in t.shape)
        return f"tensor<{dims}{word(t.dtype)}>"
    if isinstance(t, RuntimeType):
        return f"runtime<{word(t.dtype)} in [{t.lo}, {t.hi}]>"
    raise TypeError(f"not a value type: {t!r}")


def format_loc(loc: Loc) -> str:
    if loc == Loc.unknown():
        return "loc(unknown)"
    return f"loc({quote(loc.file)}:{loc.line}:{loc.col})"


def _format_result(v: Value) -> str:
    return f"%{word(v.name)} : {format_type(v.type)}"


def format_header(node: Node, indent: str = "", wrap: bool = True) -> str:
    """A node's own line (without its body): `op @name(%args) -> %r : type {attrs} loc(...)`.

    `wrap=False` keeps long attrs on the one line (for error snippets)."""
    head = f"{node.op.value} @{word(node.name)}"
    if node.args:
        head += "(" + ", ".join(f"%{word(a)}" for a in node.args) + ")"
    if node.results:
        head += " -> " + ", ".join(_format_result(r) for r in node.results)
    tail = " " + format_loc(node.loc)
    if not node.attrs:
        return head + tail
    attrs = _attrs_text(node.attrs, indent) if wrap else format_attrs(node.attrs)
    return f"{head} {attrs}{tail}"


def _print_body(body: tuple[Node, ...], indent: str, out: list[str]) -> None:
    for node in body:
        header = indent + format_header(node, indent)
        if not node.body:
            out.append(header)
            continue
        out.append(header + " {")
        _print_body(node.body, indent + "  ", out)
        out.append(indent + "}")


def print_module(m: Module) -> str:
    """The whole module as text, ending in a newline."""
    head = f"module @{word(m.name)} level={word(m.level)}"
    if m.attrs:
        head += " " + _attrs_text(m.attrs, "")
    out = [f"{head} {format_loc(m.loc)} {{"]
    _print_body(m.body, "  ", out)
    out.append("}")
    return "\n".join(out) + "\n"
