"""The IR verifier: structural rules every Module must satisfy, checked before any pass runs.

A rule is a function `(Module) -> Iterable[Violation]`, registered in `RULES` with `@rule`;
later levels add their own (`@rule` in difflet/passes, or `verify(m, extra=[...])`).

Invariants:
- `verify(m)` raises the first violation as a DiffletError at the offending node's `loc`,
  with the rule name and the node in the message and the node's text header as snippet.
- Rules never mutate or repair; they only report.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, NamedTuple, Sequence

from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Node, Op, RuntimeType, TensorType, Value

DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "bool")
ROLES = ("encoder", "denoiser", "decoder")
SNIPPET_MAX = 160


class Violation(NamedTuple):
    """One broken rule: which rule, the node that breaks it (None: the module), and why."""

    rule: str
    node: Node | None
    message: str


Rule = Callable[[Module], Iterable[Violation]]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    """Register a rule; its name (underscores as dashes) is reported with each violation."""
    RULES.append(fn)
    return fn


def rule_name(fn: Rule) -> str:
    return fn.__name__.replace("_", "-")


def walk(body: Sequence[Node], parents: tuple[Node, ...] = ()) -> Iterator[tuple[Node, tuple[Node, ...]]]:
    """Every node, depth first in order, with its chain of enclosing nodes (outermost first)."""
    for node in body:
        yield node, parents
        yield from walk(node.body, parents + (node,))


def describe(node: Node) -> str:
    from difflet.ir.printer import word

    return f"{node.op.value} @{word(node.name)}"


def describe_name(name: str) -> str:
    from difflet.ir.printer import word

    return word(name)


def _ref(name: str) -> str:
    from difflet.ir.printer import word

    return "%" + word(name)


def _typed_values(m: Module) -> Iterator[tuple[Node, Value]]:
    for node, _ in walk(m.body):
        for value in node.results:
            yield node, value


@rule
def duplicate_value(m: Module) -> Iterator[Violation]:
    """Within one body (the module's, or one node's) each value name is declared once."""
    scopes = [m.body] + [node.body for node, _ in walk(m.body) if node.body]
    for body in scopes:
        seen: dict[str, Node] = {}
        for node in body:
            for value in node.results:
                if value.name in seen:
                    first = seen[value.name]
                    yield Violation("duplicate-value", node,
                                    f"value {_ref(value.name)} of {describe(node)} is already defined "
                                    f"by {describe(first)} at {first.loc}")
                seen.setdefault(value.name, node)


def _visible_values(m: Module, parents: tuple[Node, ...]) -> set[str]:
    names = {v.name for n in m.body for v in n.results}
    for parent in parents:
        names |= {v.name for n in parent.body for v in n.results}
    return names


@rule
def undefined_arg(m: Module) -> Iterator[Violation]:
    """Args name what exists: steps name components (a bucketed one by its base name); inputs
    name module `runtime` nodes; any other node names a value declared in its own or an
    enclosing body."""
    from difflet.ir.buckets import base_name

    components = {base_name(n) for n in m.find(Op.COMPONENT)}
    runtimes = {n.name for n in m.find(Op.RUNTIME)}
    for node, parents in walk(m.body):
        if node.op == Op.STEP:
            known, what = components, "component"
        elif node.op == Op.INPUT:
            known, what = runtimes, "module-level runtime value"
        else:
            known, what = _visible_values(m, parents), "value in scope"
        for arg in node.args:
            if arg not in known:
                yield Violation("undefined-arg", node,
                                f"{describe(node)} uses {_ref(arg)}, which names no {what}")


def _empty_range(value, node: str) -> str | None:
    t = value.type
    if isinstance(t, RuntimeType) and t.lo > t.hi:
        return f"runtime value {_ref(value.name)} of {node} has lo {t.lo} > hi {t.hi}"
    return None


def _nonpositive_dim(value, node: str) -> str | None:
    t = value.type
    bad = [d for d in t.shape if d <= 0] if isinstance(t, TensorType) else []
    if bad:
        return (f"tensor {_ref(value.name)} of {node} has dimension {bad[0]} in shape "
                f"{list(t.shape)}; dims must be > 0")
    return None


def _unknown_dtype(value, node: str) -> str | None:
    if value.type.dtype not in DTYPES:
        return (f"value {_ref(value.name)} of {node} has unknown dtype {value.type.dtype!r} "
                f"(allowed: {', '.join(DTYPES)})")
    return None


# (rule name, check): a runtime range is not empty, every tensor dimension is a positive static
# size, every dtype is one the compiled programs support
VALUE_CHECKS = (("empty-range", _empty_range), ("nonpositive-dim", _nonpositive_dim),
                ("unknown-dtype", _unknown_dtype))


@rule
def value_types(m: Module) -> Iterator[Violation]:
    """Every typed value passes VALUE_CHECKS (reported under each check's own rule name)."""
    for name, check in VALUE_CHECKS:
        for node, value in _typed_values(m):
            message = check(value, describe(node))
            if message is not None:
                yield Violation(name, node, message)


@rule
def component_attrs(m: Module) -> Iterator[Violation]:
    """Every component says what it is: a `role` in ROLES and a `class`."""
    for node, _ in walk(m.body):
        if node.op != Op.COMPONENT:
            continue
        role = node.attrs.get("role")
        if role is None:
            yield Violation("component-attrs", node, f"{describe(node)} has no 'role' attr")
        elif role not in ROLES:
            yield Violation("component-attrs", node,
                            f"{describe(node)} has unknown role {role!r} "
                            f"(allowed: {', '.join(ROLES)})")
        if "class" not in node.attrs:
            yield Violation("component-attrs", node, f"{describe(node)} has no 'class' attr")


@rule
def single_schedule(m: Module) -> Iterator[Violation]:
    """A module has at most one `schedule` (anywhere)."""
    schedules = [node for node, _ in walk(m.body) if node.op == Op.SCHEDULE]
    for extra in schedules[1:]:
        yield Violation("single-schedule", extra,
                        f"{describe(extra)} is a second schedule; the first is "
                        f"{describe(schedules[0])} at {schedules[0].loc}")


@rule
def step_in_schedule(m: Module) -> Iterator[Violation]:
    """A `step` sits directly in a `schedule`'s body."""
    for node, parents in walk(m.body):
        if node.op == Op.STEP and (not parents or parents[-1].op != Op.SCHEDULE):
            where = describe(parents[-1]) if parents else "module @" + describe_name(m.name)
            yield Violation("step-in-schedule", node,
                            f"{describe(node)} is in {where}, not in a schedule")


def violations(m: Module, extra: Sequence[Rule] = ()) -> list[Violation]:
    """Every violation of RULES (then `extra`), in rule order then node order."""
    return [v for fn in [*RULES, *extra] for v in fn(m)]


def to_error(m: Module, v: Violation) -> DiffletError:
    from difflet.ir.printer import format_header

    if v.node is None:
        return DiffletError(f"verify [{v.rule}]: {v.message}", where=m.loc)
    header = format_header(v.node, wrap=False)
    snippet = header if len(header) <= SNIPPET_MAX else header[:SNIPPET_MAX - 3] + "..."
    return DiffletError(f"verify [{v.rule}]: {v.message}", where=v.node.loc, snippet=snippet)


def verify(m: Module, extra: Sequence[Rule] = ()) -> None:
    """Raise the first violation as a DiffletError at its node's loc; return None if valid."""
    for fn in [*RULES, *extra]:
        for v in fn(m):
            raise to_error(m, v)
