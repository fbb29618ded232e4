"""Typed, read-only views of the attrs passes and codegen read: a `layout` node's, a declared
attention site's and a planned attention site's. Their defaults are stated here and nowhere else.

Invariants:
- Torch-free. `Layout.of`, `Site.of`, `PlannedSite.of` convert a node's attrs (docs/ir.md
  schemas); a missing key takes the field's default, a missing required key or a wrongly typed
  value is a DiffletError naming the node and its DSL location. Keys a view does not declare
  are ignored (the attrs, not the view, are the IR).
- A site's `order` defaults by kind (DEFAULT_ORDER): joint (text, visual), self (visual),
  cross (visual, text).
"""
from __future__ import annotations

from typing import Literal, TypeVar

import msgspec

from difflet.errors import DiffletError
from difflet.ir.nodes import Attrs, Node, Op
from difflet.passes.parallel_config import ParallelConfig

DEFAULT_ORDER = {"joint": ("text", "visual"), "self": ("visual",), "cross": ("visual", "text")}
_V = TypeVar("_V", bound=msgspec.Struct)


def _convert(attrs: Attrs, view: type[_V], what: str, node: Node | None) -> _V:
    try:
        return msgspec.convert(attrs.to_python(), view)
    except msgspec.ValidationError as e:
        if node is None:
            raise DiffletError(f"{what}: {e}") from None
        raise DiffletError(f"{what} {node.name!r}: {e}", where=node.loc) from None


class Layout(ParallelConfig, frozen=True):
    """A component's `layout` attrs (passes/plan_parallel.py writes them): its own degrees (the
    ParallelConfig fields; `world` is their product) and where its tokens and ranks are. Its
    placement `groups` are not in the view: nothing reads them through it."""

    ranks: tuple[int, ...] = ()
    replicas: int = 1
    tokens: dict[str, int] = {}
    local_tokens: dict[str, int] = {}
    sp_tokens: dict[str, int] = {}
    joint_order: tuple[str, ...] = ()
    sp_regions: tuple[str, ...] = ()

    @staticmethod
    def of(layout: Node | Attrs) -> "Layout":
        """The view of a layout node (or of attrs of its schema, e.g. the module's `parallel`)."""
        node = layout if isinstance(layout, Node) else None
        return _convert(layout.attrs if node is not None else layout, Layout, "layout", node)

    @property
    def replica_world(self) -> int:
        """Ranks of one data-parallel replica (a dp layout is built once, as dp = 1)."""
        return self.world // self.dp

    def config(self) -> ParallelConfig:
        """The degrees alone."""
        return ParallelConfig(**{f: getattr(self, f) for f in ParallelConfig.__struct_fields__})


def layout_node(comp: Node) -> Node | None:
    """A planned component's layout node (None when it has none)."""
    found = comp.find(Op.LAYOUT)
    return found[0] if found else None


class Site(msgspec.Struct, frozen=True):
    """A declared attention site's attrs (frontend/lower.py writes them)."""

    kind: Literal["joint", "self", "cross"]
    heads: int
    head_dim: int
    order: tuple[str, ...] = ()
    text_mask: bool = False
    valid: str | None = None

    @staticmethod
    def of(node: Node) -> "Site":
        site = _convert(node.attrs, Site, "attention site", node)
        return site if site.order else msgspec.structs.replace(site, order=DEFAULT_ORDER[site.kind])

    @property
    def streams(self) -> tuple[str, str]:
        """(query stream, key stream); `joint` sites attend over visual + text."""
        if self.kind == "joint":
            return "joint", "joint"
        if self.kind == "self":
            return self.order[0], self.order[0]
        return self.order[0], self.order[1] if len(self.order) > 1 else "text"

    @property
    def text_first(self) -> bool:
        return self.order[0] == "text"


class PlannedSite(msgspec.Struct, frozen=True):
    """A planned attention site's attrs, in a layout's body (passes/plan_parallel.py writes them)."""

    mode: str
    query: str
    key: str
    heads: int
    heads_local: int
    head_dim: int
    q_len: int
    kv_len: int
    calls: tuple[str, ...] = ()
    mask: str = "none"
    valid: str | None = None

    @staticmethod
    def of(node: Node) -> "PlannedSite":
        return _convert(node.attrs, PlannedSite, "planned attention site", node)
