"""Shape buckets: one module serving several sizes, and the single-size view of each size.

A bucketed module is the merge of modules lowered (or planned) from one description at several
sizes. Invariants:
- attrs `buckets` lists the sizes in order ("WxH", or "WxHxF" for video, with a "bN" suffix for
  batch size N > 1 of a description whose profile has `batch`); the module's profile and every
  other module attr are the first size's. A batch bucket is a program variant of its size, not a
  size a request asks for: `served_sizes` leaves them out.
- A component whose node is the same at every size appears once (size-independent: one program,
  compiled once); any other appears once per size, named `NAME@SIZE`, with attr `bucket = SIZE`.
- Runtime values and the schedule do not depend on the size (merging refuses them otherwise).
- `view(merge(ms), size_of(m)) == m` for every m in ms: passes, codegen and the runtime work on
  single-size views and never see the merged form.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

from difflet.errors import DiffletError
from difflet.ir.nodes import Attrs, Module, Node, Op

SEP = "@"
_SIZE = re.compile(r"(\d+)x(\d+)(?:x(\d+))?(?:b(\d+))?\Z")


def size_of(profile: Any) -> str:
    """"WxH" (or "WxHxF" when the profile has frames; "...bN" when its batch N is not 1)."""
    frames, batch = profile.get("frames"), int(profile.get("batch", 1))
    return (f"{profile['width']}x{profile['height']}" + (f"x{frames}" if frames is not None else "")
            + (f"b{batch}" if batch != 1 else ""))


def parse_size(text: str, video: bool, where: str = "--shapes") -> dict[str, int]:
    """"1344x768" -> {"width": 1344, "height": 768}; video sizes need the frame count ("WxHxF");
    a "bN" suffix (batch buckets) adds {"batch": N}."""
    m = _SIZE.match(text.strip())
    if m is None or bool(m.group(3)) != video:
        want = "WxHxF (width x height x frames)" if video else "WxH (width x height)"
        raise DiffletError(f"size {text.strip()!r} is not {want}", where=where)
    size = {"width": int(m.group(1)), "height": int(m.group(2))}
    if video:
        size["frames"] = int(m.group(3))
    if m.group(4):
        size["batch"] = int(m.group(4))
    return size


def batch_of(size: str) -> int:
    """The batch size of a bucket key ("32x32b4" -> 4, "32x32" -> 1)."""
    head, b, tail = size.rpartition("b")
    return int(tail) if b and tail.isdigit() else 1


def unbatched(size: str) -> str:
    """The size a request asks for, of a bucket key ("32x32b4" -> "32x32")."""
    return size.rpartition("b")[0] if batch_of(size) != 1 else size


def served_sizes(sizes: Sequence[str]) -> tuple[str, ...]:
    """The sizes requests may ask for (batch buckets left out), in order."""
    return tuple(s for s in sizes if batch_of(s) == 1)


def batch_sizes(sizes: Sequence[str]) -> tuple[int, ...]:
    """The compiled batch sizes, ascending ((1,) when there are no batch buckets)."""
    return tuple(sorted({1, *(batch_of(s) for s in sizes)}))


def split_batches(text: str, where: str = "--batch-sizes") -> list[int]:
    """"1,2,4" -> [1, 2, 4] (CLI `--batch-sizes`, profile `batch_sizes`); 1 must be listed."""
    try:
        out = [int(p) for p in (p.strip() for p in text.split(",")) if p]
    except ValueError:
        raise DiffletError(f"batch sizes {text!r} are not integers like 1,2,4", where=where) from None
    if any(b < 1 for b in out) or len(set(out)) != len(out) or (out and 1 not in out):
        raise DiffletError(f"batch sizes {text!r}: distinct positive integers including 1", where=where)
    return sorted(out)


def split_sizes(text: str) -> list[str]:
    """"1024x1024, 1344x768" -> ["1024x1024", "1344x768"] (CLI `--shapes`, profile `shapes`)."""
    return [s for s in (p.strip() for p in text.split(",")) if s]


def buckets(module: Module) -> tuple[str, ...]:
    """The module's sizes; () for a single-size module."""
    return tuple(module.attrs.get("buckets") or ())


def base_name(node: Node) -> str:
    return node.name.split(SEP, 1)[0] if node.attrs.get("bucket") is not None else node.name


def merge(modules: Sequence[Module]) -> Module:
    """One bucketed module from single-size modules of one description (see module invariants)."""
    first = modules[0]
    sizes = [size_of(m.attrs["profile"]) for m in modules]
    dup = next((s for i, s in enumerate(sizes) if s in sizes[:i]), None)
    if dup is not None:
        raise DiffletError(f"size {dup} is listed twice", where="--shapes")
    body: list[Node] = []
    for i, node in enumerate(first.body):
        same_index = [m.body[i] if i < len(m.body) else None for m in modules]
        if all(n == node for n in same_index):
            body.append(node)
        elif node.op == Op.COMPONENT and all(n is not None and n.name == node.name for n in same_index):
            body += [_rename(n, f"{n.name}{SEP}{s}", _with(n.attrs, bucket=s)) for n, s in zip(same_index, sizes)]
        else:
            raise DiffletError(f"{node.op.value} {node.name!r} depends on the size; shape buckets need "
                               "it the same at every size", where=node.loc)
    if any(len(m.body) != len(first.body) for m in modules):
        raise DiffletError("the sizes lower to different numbers of nodes", where=first.loc)
    merged = Module(first.name, first.level, _with(first.attrs, buckets=tuple(sizes)), tuple(body), first.loc)
    for m, s in zip(modules, sizes):
        if view(merged, s) != m:  # e.g. a module attr other than the size differs
            raise DiffletError(f"size {s} differs from size {sizes[0]} in more than its "
                               "size-dependent components", where=first.loc)
    return merged


def view(module: Module, size: str) -> Module:
    """The single-size module of `size` (exactly what lowering/planning at that size gives)."""
    sizes = buckets(module)
    if size not in sizes:
        raise DiffletError(f"size {size} is not served (sizes: {', '.join(sizes)})", where="size")
    body = []
    for node in module.body:
        bucket = node.attrs.get("bucket")
        if bucket is None:
            body.append(node)
        elif bucket == size:
            body.append(_rename(node, base_name(node), Attrs([kv for kv in node.attrs.items() if kv[0] != "bucket"])))
    profile = dict(module.attrs["profile"].items())
    profile.update((k, v) for k, v in parse_size(size, "frames" in profile).items())
    if "batch" in profile:
        profile["batch"] = batch_of(size)
    attrs = [(k, Attrs(profile) if k == "profile" else v) for k, v in module.attrs.items() if k != "buckets"]
    return Module(module.name, module.level, Attrs(attrs), tuple(body), module.loc)


def views(module: Module) -> list[tuple[str, Module]]:
    """(size, view) for every size of a bucketed module; [(size, module)] for a single-size one."""
    sizes = buckets(module)
    if not sizes:
        return [(size_of(module.attrs["profile"]), module)]
    return [(s, view(module, s)) for s in sizes]


def _rename(node: Node, name: str, attrs: Attrs) -> Node:
    return Node(node.op, name, attrs, node.args, node.results, node.body, node.loc)


def _with(attrs: Attrs, **extra: Any) -> Attrs:
    return Attrs([kv for kv in attrs.items() if kv[0] not in extra] + list(extra.items()))
