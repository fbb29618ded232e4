"""Evaluating DSL expressions and values for one profile, and the shape checks lowering runs.

Invariants:
- Integer `/` must divide exactly (a shape that silently truncates is a bug); `//` floors.
- A name in an expression must be a profile parameter; anything else is an undefined name. A
  parameter whose value is a word naming another parameter (`image_width = width`) has that
  one's value, so it follows `--profile` overrides and every shape bucket's size.
- `comp.key` reads component comp's config (and keys its family derives from it: `with_derived`);
  configs themselves may not refer to configs (an Evaluator built without `configs`), so there
  is no evaluation order to get wrong.
- Every error points at the offending expression (`file:line:col` + its source text).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from difflet.errors import DiffletError
from difflet.frontend import ast
from difflet.ir.nodes import Attrs, Loc, freeze
from difflet.ir.verify import DTYPES


class Source:
    """A DSL file's path and text: turns spans into Locs and snippets."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.text = text

    def loc(self, span: ast.Span) -> Loc:
        return Loc(self.path, span.line, span.col)

    def snippet(self, span: ast.Span) -> str:
        """The span's text on one line; a multi-line span shows its first line only."""
        piece = self.text[span.start:span.end]
        if "\n" in piece.strip():
            first = self.text.splitlines()[span.line - 1][span.col - 1:]
            return " ".join(first.split()) + " ..."
        return " ".join(piece.split())

    def error(self, message: str, span: ast.Span) -> DiffletError:
        return DiffletError(message, where=self.loc(span), snippet=self.snippet(span))


def resolved(profile: Mapping[str, Any], name: str) -> Any:
    """Profile parameter `name`'s value, following words that name other parameters
    (`image_width = width`); a cycle stops at its word."""
    value, seen = profile[name], {name}
    while isinstance(value, str) and value in profile and value not in seen:
        seen.add(value)
        value = profile[value]
    return value


class Evaluator:
    """Evaluates expressions and values against a profile (`name -> int | float | str`) and,
    when given, the component configs (`name -> Attrs`, or None: from a checkpoint not given)."""

    def __init__(self, src: Source, profile: Mapping[str, Any],
                 configs: Mapping[str, Attrs | None] | None = None) -> None:
        self.src = src
        self.profile = profile
        self.configs = configs

    def expr(self, e: ast.Expr) -> int | float:
        if isinstance(e, ast.Num):
            return e.value
        if isinstance(e, ast.Ref):
            if e.name not in self.profile:
                known = ", ".join(self.profile) or "none"
                raise self.src.error(f"undefined name {e.name!r} (profile parameters: {known})", e.span)
            value = resolved(self.profile, e.name)
            if isinstance(value, str) and value in self.profile:
                raise self.src.error(f"profile parameter {e.name!r} names {self.profile[e.name]!r}, which leads "
                                     "back to it: an alias cycle", e.span)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.src.error(f"profile parameter {e.name!r} is {value!r}, not a number", e.span)
            return value
        if isinstance(e, ast.Neg):
            return -self.expr(e.operand)
        if isinstance(e, ast.BinOp):
            return self._binop(e)
        if isinstance(e, ast.ConfigRef):
            value = self.config_value(e)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                hint = "; len(...) counts a list" if isinstance(value, tuple) else ""
                raise self.src.error(f"{e.component}.{e.key} is {_plain(value)!r}, not a number{hint}", e.span)
            return value
        if isinstance(e, ast.Call):
            if e.func != "len":
                raise self.src.error(f"unknown function {e.func!r} (the only one is len)", e.span)
            value = self.config_value(e.arg) if isinstance(e.arg, ast.ConfigRef) else None
            if not isinstance(value, tuple):
                raise self.src.error("len(...) takes a list-valued config key, e.g. "
                                     "len(vae.block_out_channels)", e.arg.span)
            return len(value)
        raise self.src.error("expected a number expression", e.span)

    def config_value(self, e: ast.ConfigRef) -> Any:
        if self.configs is None:
            raise self.src.error("a config value cannot refer to a component's config", e.span)
        if e.component not in self.configs:
            known = ", ".join(self.configs) or "none"
            raise self.src.error(f"undefined component {e.component!r} (components: {known})", e.span)
        config = self.configs[e.component]
        if config is None:
            raise self.src.error(f"component {e.component!r} takes its config from the checkpoint: lower "
                                 "with --weights DIR, or give `config from checkpoint default { ... }`",
                                 e.span)
        value: Any = config
        for depth, part in enumerate(e.key.split(".")):  # `text_config.hidden_size`: walk the nested maps
            if not isinstance(value, Attrs) or part not in value:
                where = ".".join(e.key.split(".")[:depth]) or "config"
                at = f" (in {e.component}.{where})" if depth else ""
                raise self.src.error(f"the config of component {e.component!r} has no key {e.key!r}{at}", e.span)
            value = value[part]
        return value

    def int_expr(self, e: ast.Expr, what: str = "value") -> int:
        v = self.expr(e)
        if not isinstance(v, int):
            raise self.src.error(f"{what} must be an integer, got {v!r}", e.span)
        return v

    def _binop(self, e: ast.BinOp) -> int | float:
        a, b = self.expr(e.lhs), self.expr(e.rhs)
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            return a * b
        if e.op == "**":
            return a ** b
        if b == 0:
            raise self.src.error("division by zero", e.span)
        if e.op == "//":
            return a // b
        if isinstance(a, int) and isinstance(b, int):
            if a % b:
                raise self.src.error(f"{a} / {b} does not divide exactly (use // to floor)", e.span)
            return a // b
        return a / b

    def value(self, v: ast.Value) -> Any:
        """A config/step-parameter value as an IR attribute value."""
        if isinstance(v, ast.Lit):
            return v.value
        if isinstance(v, ast.Word):
            return v.name
        if isinstance(v, ast.ListV):
            return tuple(self.value(i) for i in v.items)
        if isinstance(v, ast.MapV):
            return self.map(v)
        if isinstance(v, ast.ClassObject):
            return Attrs([("class", v.qualname), ("config", self.map(v.config))])
        return self.expr(v)

    def map(self, m: ast.MapV) -> Attrs:
        seen: set[str] = set()
        items = []
        for entry in m.entries:
            if entry.key in seen:
                raise self.src.error(f"duplicate key {entry.key!r}", entry.span)
            seen.add(entry.key)
            items.append((entry.key, self.value(entry.value)))
        return Attrs(items)

    def shape(self, spec: ast.TensorSpec) -> tuple[int, ...]:
        dims = tuple(self.int_expr(d, "a shape dimension") for d in spec.dims)
        for d, e in zip(dims, spec.dims):
            if d <= 0:
                raise self.src.error(f"shape dimension evaluates to {d}; it must be positive", e.span)
        return dims


def with_derived(configs: Mapping[str, Attrs | None], components: Sequence[ast.ComponentDecl],
                 derive: Mapping[str, Callable[[dict], Mapping[str, Any]]]) -> dict[str, Attrs | None]:
    """The configs expressions read: each component's config, then the keys its family derives
    from it (`derive`: FamilyFacts.derived_config, class -> config -> keys, e.g. a VAE's cache
    channel counts), which never shadow a key the config holds (a null one counts as absent)."""
    out = dict(configs)
    for c in components:
        config = out[c.name]
        if config is not None and c.qualname in derive:
            extra = derive[c.qualname](config.to_python())
            own = [(k, v) for k, v in config.items() if v is not None or k not in extra]
            added = [(k, freeze(v)) for k, v in extra.items() if config.get(k) is None]
            out[c.name] = Attrs([*own, *added])
    return out


def _plain(value: Any) -> Any:
    return value.to_python() if isinstance(value, Attrs) else list(value) if isinstance(value, tuple) else value


def resolve_dtype(src: Source, name: str, profile: Mapping[str, Any], span: ast.Span) -> str:
    """A dtype written directly (`float32`) or through a profile parameter (`dtype`)."""
    value = profile.get(name, name)
    if value not in DTYPES:
        if name in profile:
            raise src.error(f"profile parameter {name!r} = {value!r} is not a dtype ({', '.join(DTYPES)})", span)
        raise src.error(f"undefined name {name!r}: neither a dtype ({', '.join(DTYPES)}) "
                        "nor a profile parameter", span)
    return value
