"""The DSL's abstract syntax: small frozen dataclasses, each with the source span it came from.

Invariants:
- Every node carries a `Span` (1-based line/column of its first character and 0-based character
  offsets into the source), so lowering can report `file:line:col` plus the offending text.
- Expressions are unevaluated here; `difflet.frontend.shapes` evaluates them for a profile.
- Ordering is as written: inputs, outputs, map entries and steps keep source order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class Span:
    """Where a node sits in its source: first line/col (1-based), character offsets [start, end)."""

    line: int
    col: int
    start: int
    end: int


# ---- expressions (integers/floats over profile parameters)

@dataclass(frozen=True)
class Num:
    value: int | float
    span: Span


@dataclass(frozen=True)
class Ref:
    """A reference to a profile parameter by name."""

    name: str
    span: Span


@dataclass(frozen=True)
class BinOp:
    op: str  # one of + - * / // **
    lhs: "Expr"
    rhs: "Expr"
    span: Span


@dataclass(frozen=True)
class Neg:
    operand: "Expr"
    span: Span


@dataclass(frozen=True)
class ConfigRef:
    """`component.key` or `component.sub.key`: a (nested) key of a component's config (inline, default
    or from the checkpoint); `key` is the dotted path below the component."""

    component: str
    key: str
    span: Span


@dataclass(frozen=True)
class Call:
    """`len(expr)`: the only function; it counts the items of a list-valued config key."""

    func: str
    arg: "Expr"
    span: Span


Expr = Union[Num, Ref, BinOp, Neg, ConfigRef, Call]


# ---- values (configs, step parameters, profile literals)

@dataclass(frozen=True)
class Lit:
    """A string, bool or null literal (numbers are `Num`)."""

    value: str | bool | None
    span: Span


@dataclass(frozen=True)
class Word:
    """A bare identifier used as a profile value (e.g. `dtype = bfloat16`)."""

    name: str
    span: Span


@dataclass(frozen=True)
class ListV:
    items: tuple["Value", ...]
    span: Span


@dataclass(frozen=True)
class MapEntry:
    key: str
    value: "Value"
    span: Span


@dataclass(frozen=True)
class MapV:
    entries: tuple[MapEntry, ...]
    span: Span


@dataclass(frozen=True)
class ClassObject:
    """`diffusers.X { ... }`: lowers to `Attrs(class="diffusers.X", config=Attrs(...))`."""

    qualname: str
    qualname_span: Span
    config: MapV
    span: Span


Value = Union[Num, Ref, BinOp, Neg, ConfigRef, Call, Lit, Word, ListV, MapV, ClassObject]


# ---- declarations

@dataclass(frozen=True)
class Param:
    name: str
    value: Union[Num, Lit, Word]
    span: Span


@dataclass(frozen=True)
class RuntimeDecl:
    name: str
    dtype: str
    lo: Expr
    hi: Expr
    default: Expr
    doc: str
    span: Span


@dataclass(frozen=True)
class TensorSpec:
    dtype: str  # a dtype name or a profile parameter holding one
    dims: tuple[Expr, ...]
    span: Span


@dataclass(frozen=True)
class InputDecl:
    """A program input: a tensor (`tensor`) or a runtime value (`runtime` names it)."""

    name: str
    tensor: TensorSpec | None
    runtime: str | None
    span: Span


@dataclass(frozen=True)
class OutputDecl:
    name: str
    tensor: TensorSpec
    select: str | int
    span: Span


@dataclass(frozen=True)
class AttentionDecl:
    """An attention site. `fields` maps heads/head_dim/order/text_mask/valid to (value, span)."""

    pattern: str
    kind: str
    fields: tuple[tuple[str, object, Span], ...]
    span: Span


@dataclass(frozen=True)
class TokenizerDecl:
    qualname: str
    subfolder: str
    max_length: Expr
    span: Span


@dataclass(frozen=True)
class Setting:
    """A one-word component setting: `entry decode`, `dtype bfloat16`."""

    key: str
    value: str
    span: Span


@dataclass(frozen=True)
class ComponentDecl:
    """`<role> <name> = <class> from "<subfolder>" { ... }`.

    `config` is the written map: stated values (`config {...}`), the defaults used without
    weights (`config from checkpoint default {...}`), or None (`config from checkpoint`).
    """

    role: str
    name: str
    qualname: str
    qualname_span: Span
    subfolder: str
    config: MapV | None
    config_from_checkpoint: bool
    config_span: Span
    settings: tuple[Setting, ...]
    options: MapV | None  # `options {...}`: family options of the program (FamilyFacts.options)
    tokenizer: TokenizerDecl | None
    inputs: tuple[InputDecl, ...]
    outputs: tuple[OutputDecl, ...]
    attentions: tuple[AttentionDecl, ...]
    span: Span


@dataclass(frozen=True)
class StepDecl:
    name: str
    components: tuple[tuple[str, Span], ...]
    params: MapV | None
    span: Span


@dataclass(frozen=True)
class ModelDecl:
    name: str
    family: str
    params: tuple[Param, ...]
    runtimes: tuple[RuntimeDecl, ...]
    components: tuple[ComponentDecl, ...]
    steps: tuple[StepDecl, ...]
    schedule_span: Span | None
    span: Span
