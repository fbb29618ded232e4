"""The IR verifier: one invalid case per rule beside the valid module it was derived from.

Each invalid case changes one node of `flux_like_module()` (which verifies clean) and must be
reported at that node's loc, naming the rule and the node.
"""
from __future__ import annotations

from typing import Callable

import msgspec
import pytest

from difflet.errors import DiffletError
from difflet.ir.nodes import Attrs, Loc, Module, Node, Op, RuntimeType, TensorType, Value
from difflet.ir.verify import RULES, Violation, verify, violations
from tests import ir_samples

BAD = Loc("bad.dsl", 77, 7)  # the loc every injected node carries


def _with_body(node, body):
    return msgspec.structs.replace(node, body=tuple(body))


def _edit(module: Module, name: str, fn: Callable[[Node], list[Node]]) -> Module:
    """Replace the top-level node `name` by fn(node) (a list: drop, keep, or add siblings)."""
    body = [new for n in module.body for new in (fn(n) if n.name == name else [n])]
    return _with_body(module, body)


def _in_body(module: Module, name: str, extra: Node) -> Module:
    return _edit(module, name, lambda n: [_with_body(n, (*n.body, extra))])


def _tensor(name: str, shape: tuple, dtype: str = "float32") -> Node:
    return Node(Op.INPUT, name, results=(Value(name, TensorType(dtype, shape)),), loc=BAD)


def _set_attrs(module: Module, name: str, attrs: Attrs) -> Module:
    return _edit(module, name, lambda n: [msgspec.structs.replace(n, attrs=attrs, loc=BAD)])


flux = ir_samples.flux_like_module
INVALID = {
    "duplicate-value": lambda: _in_body(flux(), "transformer", _tensor("hidden_states", (1, 2))),
    "duplicate-value/module": lambda: _edit(flux(), "seed", lambda n: [
        n, msgspec.structs.replace(n, name="seed2", loc=BAD)]),
    "undefined-arg/step": lambda: _in_body(flux(), "main", Node(Op.STEP, "flux.decode",
                                                                args=("unet",), loc=BAD)),
    "undefined-arg/step-names-runtime": lambda: _in_body(
        flux(), "main", Node(Op.STEP, "flux.denoise", args=("seed",), loc=BAD)),
    "undefined-arg/input": lambda: _in_body(flux(), "transformer", Node(
        Op.INPUT, "count", args=("valid_txt",),
        results=(Value("count", RuntimeType("int64", 1, 32)),), loc=BAD)),
    "undefined-arg/input-names-component": lambda: _in_body(flux(), "transformer", Node(
        Op.INPUT, "count", args=("vae",),
        results=(Value("count", RuntimeType("int64", 1, 32)),), loc=BAD)),
    "empty-range": lambda: _edit(flux(), "step", lambda n: [msgspec.structs.replace(
        n, results=(Value("step", RuntimeType("int64", 4, 3)),), loc=BAD)]),
    "nonpositive-dim": lambda: _in_body(flux(), "vae", _tensor("extra", (1, 0, 3))),
    "nonpositive-dim/negative": lambda: _in_body(flux(), "vae", _tensor("extra", (-1,))),
    "unknown-dtype": lambda: _in_body(flux(), "vae", _tensor("extra", (1,), dtype="float8")),
    "unknown-dtype/runtime": lambda: _edit(flux(), "seed", lambda n: [msgspec.structs.replace(
        n, results=(Value("seed", RuntimeType("uint128", 0, 1)),), loc=BAD)]),
    "component-attrs/no-role": lambda: _set_attrs(
        flux(), "vae", Attrs({"class": "diffusers.AutoencoderKL"})),
    "component-attrs/no-class": lambda: _set_attrs(flux(), "vae", Attrs(role="decoder")),
    "component-attrs/bad-role": lambda: _set_attrs(
        flux(), "vae", Attrs({"role": "upscaler", "class": "diffusers.AutoencoderKL"})),
    "single-schedule": lambda: _edit(flux(), "main", lambda n: [
        n, msgspec.structs.replace(n, name="other", loc=BAD)]),
    "step-in-schedule/module": lambda: _edit(flux(), "main", lambda n: [
        n, Node(Op.STEP, "flux.decode", args=("vae",), loc=BAD)]),
    "step-in-schedule/component": lambda: _in_body(flux(), "vae", Node(Op.STEP, "flux.decode",
                                                                      loc=BAD)),
}

MESSAGES = {
    "duplicate-value": "%hidden_states of input @hidden_states is already defined",
    "duplicate-value/module": "%seed of runtime @seed2 is already defined by runtime @seed",
    "undefined-arg/step": "step @flux.decode uses %unet, which names no component",
    "undefined-arg/step-names-runtime": "uses %seed, which names no component",
    "undefined-arg/input": "input @count uses %valid_txt, which names no module-level runtime",
    "undefined-arg/input-names-component": "uses %vae, which names no module-level runtime",
    "empty-range": "runtime value %step of runtime @step has lo 4 > hi 3",
    "nonpositive-dim": "tensor %extra of input @extra has dimension 0 in shape [1, 0, 3]",
    "nonpositive-dim/negative": "has dimension -1",
    "unknown-dtype": "unknown dtype 'float8'",
    "unknown-dtype/runtime": "value %seed of runtime @seed has unknown dtype 'uint128'",
    "component-attrs/no-role": "component @vae has no 'role' attr",
    "component-attrs/no-class": "component @vae has no 'class' attr",
    "component-attrs/bad-role": "component @vae has unknown role 'upscaler'",
    "single-schedule": "schedule @other is a second schedule",
    "step-in-schedule/module": "step @flux.decode is in module @flux_tiny, not in a schedule",
    "step-in-schedule/component": "step @flux.decode is in component @vae, not in a schedule",
}


def test_valid_modules_pass() -> None:
    verify(ir_samples.flux_like_module())  # shadowing %valid_text / %sample across scopes is fine
    verify(ir_samples.empty_module())
    assert violations(ir_samples.flux_like_module()) == []


@pytest.mark.parametrize("case", sorted(INVALID))
def test_each_rule_reports_at_the_node(case: str) -> None:
    module = INVALID[case]()
    with pytest.raises(DiffletError) as info:
        verify(module)
    err = info.value
    rule = case.split("/")[0]
    assert err.where == BAD
    assert err.message.startswith(f"verify [{rule}]: ")
    assert MESSAGES[case] in err.message
    assert err.snippet and "loc(\"bad.dsl\":77:7)" in err.snippet
    # exactly this one thing is wrong
    assert [v.rule for v in violations(module)] == [rule]


def test_all_violations_are_listed_in_rule_order() -> None:
    found = violations(ir_samples.edge_module())
    assert [v.rule for v in found] == ["undefined-arg", "undefined-arg", "empty-range",
                                       "nonpositive-dim", "unknown-dtype", "unknown-dtype",
                                       "component-attrs"]


def test_extra_rules_extend_the_verifier() -> None:
    def planned_needs_target(m: Module):
        if m.level == "planned" and "target" not in m.attrs:
            yield Violation("planned-needs-target", None, f"module {m.name} has no target")

    module = msgspec.structs.replace(ir_samples.flux_like_module(), level="planned")
    verify(module)
    with pytest.raises(DiffletError) as info:
        verify(module, extra=[planned_needs_target])
    assert info.value.where == module.loc
    assert "verify [planned-needs-target]" in info.value.message
    assert planned_needs_target not in RULES
