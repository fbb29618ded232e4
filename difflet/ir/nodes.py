"""The one IR data structure: frozen msgspec Structs.

Invariants:
- Every node is immutable and hashable; attribute values are only None, bool, int, float,
  str, tuples of attribute values, and `Attrs` (an ordered, frozen mapping).
- Static facts (shapes, dtypes, kernel/layout choices) live in `TensorType` and `attrs`;
  per-request/per-step values are `RuntimeType` and never carry a shape.
- Levels (pipeline, planned, manifest) differ by `Module.level`, ops and attrs, not by class.
- Every node keeps the DSL source location it came from (`Loc`).
"""
from __future__ import annotations

import enum
from typing import Any, Iterator, Union

import msgspec


class Loc(msgspec.Struct, frozen=True, array_like=True):
    """A source location: file, 1-based line and column. `Loc.unknown()` for synthesized nodes."""

    file: str
    line: int
    col: int

    @staticmethod
    def unknown() -> "Loc":
        return Loc("<unknown>", 0, 0)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class Attrs:
    """An ordered, immutable, hashable str -> attribute-value mapping.

    Keys are unique; order is kept as written (it is part of equality, so print/parse and
    encode/decode must preserve it).
    """

    __slots__ = ("_items",)

    def __init__(self, items: Any = (), **kwargs: Any) -> None:
        pairs = list(items.items() if isinstance(items, (dict, Attrs)) else items)
        pairs += list(kwargs.items())
        frozen = tuple((str(k), freeze(v)) for k, v in pairs)
        keys = [k for k, _ in frozen]
        if len(set(keys)) != len(keys):
            raise ValueError(f"duplicate attribute keys in {keys}")
        self._items = frozen

    def items(self) -> tuple[tuple[str, Any], ...]:
        return self._items

    def keys(self) -> list[str]:
        return [k for k, _ in self._items]

    def get(self, key: str, default: Any = None) -> Any:
        for k, v in self._items:
            if k == key:
                return v
        return default

    def __getitem__(self, key: str) -> Any:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return any(k == key for k, _ in self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Attrs) and self._items == other._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"Attrs({dict(self._items)!r})"

    def set(self, **updates: Any) -> "Attrs":
        """A copy with keys replaced in place or appended at the end."""
        items = dict(self._items)
        items.update(updates)
        return Attrs(items)

    def to_python(self) -> dict:
        """Plain dicts and lists, e.g. for a diffusers `from_config`."""
        return {k: thaw(v) for k, v in self._items}


def freeze(value: Any) -> Any:
    """Normalize a Python value into an attribute value (lists -> tuples, dicts -> Attrs)."""
    if value is None or isinstance(value, (bool, int, float, str, Attrs)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return Attrs(value)
    raise TypeError(f"not an attribute value: {value!r} ({type(value).__name__})")


def thaw(value: Any) -> Any:
    if isinstance(value, Attrs):
        return value.to_python()
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


class TensorType(msgspec.Struct, frozen=True, tag="tensor"):
    """A static tensor: dtype name (float32, bfloat16, int64, ...) and a fully static shape."""

    dtype: str
    shape: tuple[int, ...]


class RuntimeType(msgspec.Struct, frozen=True, tag="runtime"):
    """A small per-request or per-step scalar that crosses into a program at run time.

    `lo`/`hi` is the inclusive range the compiled program supports (e.g. valid_text in [1, 512]).
    """

    dtype: str
    lo: int
    hi: int


ValueType = Union[TensorType, RuntimeType]


class Value(msgspec.Struct, frozen=True, array_like=True):
    """A named value produced by a node (or declared by an `input`/`runtime` node)."""

    name: str
    type: ValueType

    @property
    def is_runtime(self) -> bool:
        return isinstance(self.type, RuntimeType)


class Op(str, enum.Enum):
    """Every op of every level. Attr schemas per op are documented in docs/ir.md."""

    # pipeline level
    RUNTIME = "runtime"        # declares a runtime value (valid_text, seed, step)
    COMPONENT = "component"    # one compiled component: encoder | denoiser | decoder
    INPUT = "input"            # a component's input (tensor, or an arg naming a runtime value)
    OUTPUT = "output"          # a component's output tensor
    ATTENTION = "attention"    # an attention site inside a denoiser
    SCHEDULE = "schedule"      # the host schedule; body holds steps
    STEP = "step"              # one host step, naming a registered host function
    # planned level (added by passes)
    LAYOUT = "layout"          # a component's parallel layout; body holds splits/collectives
    SPLIT = "split"            # a per-linear column/row split
    COLLECTIVE = "collective"  # an explicit collective (all_gather, reduce_scatter, ...)
    PROBE = "probe"            # the caching probe program


class Node(msgspec.Struct, frozen=True):
    """One IR node. `args` name values consumed; `results` declares values produced."""

    op: Op
    name: str
    attrs: Attrs = Attrs()
    args: tuple[str, ...] = ()
    results: tuple[Value, ...] = ()
    body: tuple["Node", ...] = ()
    loc: Loc = Loc.unknown()

    def find(self, op: Op, name: str | None = None) -> list["Node"]:
        return [n for n in self.body if n.op == op and (name is None or n.name == name)]


class Module(msgspec.Struct, frozen=True):
    """A whole model for one serving profile. `level`: pipeline | planned."""

    name: str
    level: str
    attrs: Attrs
    body: tuple[Node, ...]
    loc: Loc = Loc.unknown()

    def find(self, op: Op, name: str | None = None) -> list[Node]:
        return [n for n in self.body if n.op == op and (name is None or n.name == name)]

    def component(self, name: str) -> Node:
        found = self.find(Op.COMPONENT, name)
        if not found:
            raise KeyError(f"no component {name!r} in module {self.name!r}")
        return found[0]

    def components(self, role: str | None = None) -> list[Node]:
        return [c for c in self.find(Op.COMPONENT) if role is None or c.attrs.get("role") == role]
