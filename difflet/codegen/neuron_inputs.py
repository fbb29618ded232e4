"""Runtime values cross into a neuron program as shape-[1] tensors, never as 0-d ones.

Why (measured with torch-xla 2.9 on CPU, bench/results/xla_check.md): torch_neuronx.trace moves
each example input to the XLA device with `tensor.to(xla_device)` (torch_neuronx/xla_impl/
hlo_conversion.py `xla_trace`, read in a public copy whose SDK release is not stated; it drops an
input with no HLO parameter as "unused" with a warning), and torch-xla lowers a 0-d tensor moved that way by its value
(`XLATensor::GetIrValueForTensor`, torch_xla/csrc/tensor.cpp): 0 or +-1 become an HLO constant
(`IsSpecialScalar`; `XLA_NO_SPECIAL_SCALARS=1` turns only this off) and any other value the
scalar cache's device data, shared with every equal Python scalar of the graph. Traced at such a
value, the runtime input is not its own parameter: torch_neuronx drops it as "unused" or feeds
it where the graph meant its constant. A tensor with one dimension always takes the plain upload
path and stays its own parameter whatever its value (measured: one compile served 16/8/1/0).

Invariants:
- `vector_runtime_inputs(pm, positions)` makes `pm` take each runtime input (IR order
  positions) as shape [1], reshaped to 0-d before its forward: same results, and the same
  module and state-dict keys (a forward pre-hook, not a wrapper), so the rank files and
  `replace_weights` keys still match the traced module.
- `explicit_signature(pm, node)` gives `pm.forward` the IR input names as its parameters (NxD
  ModelBuilder V2's `trace` refuses `*args` forwards and calls the model with keyword inputs:
  neuronx_distributed/trace/functions.py `_validate_model`, `treat_inputs_as_kwargs=True`);
  positional and keyword calls compute the same, state-dict keys unchanged.
- `trace_inputs(node)` = build.example_inputs(node) with the runtime inputs as shape [1];
  `call_inputs(positions, tensors)` does the same to a call's (checked, 0-d) inputs.
- Torch only, no Neuron SDK: tested on CPU (tests/test_neuron_load.py).
"""
from __future__ import annotations

import inspect

import torch

from difflet.ir.nodes import Node, RuntimeType


def runtime_positions(node: Node) -> list[int]:
    """Positions (IR input order) of the component's runtime inputs."""
    from difflet.codegen.program import program_inputs

    return [i for i, v in enumerate(program_inputs(node)) if isinstance(v.type, RuntimeType)]


def call_inputs(positions, tensors) -> tuple[torch.Tensor, ...]:
    """The call's inputs with each runtime value reshaped from 0-d to [1] (no copy)."""
    at = set(positions)
    return tuple(t.reshape(1) if i in at else t for i, t in enumerate(tensors))


def trace_inputs(node: Node) -> tuple[torch.Tensor, ...]:
    """Example inputs for a neuron trace: runtime values (at their upper bound) as shape [1]."""
    from difflet.codegen.build import example_inputs

    return call_inputs(runtime_positions(node), example_inputs(node))


def input_names(node: Node) -> list[str]:
    from difflet.codegen.program import program_inputs

    return [v.name for v in program_inputs(node)]


def vector_runtime_inputs(pm: torch.nn.Module, positions, names=()):
    """Make `pm` take its runtime inputs as shape [1] (module docstring), passed positionally or
    by name (`names`: the IR input names); returns the hook handle."""
    at = frozenset(positions)
    by_name = frozenset(names[i] for i in at if i < len(names))

    def to_scalars(_module, args, kwargs):
        args = tuple(a.reshape(()) if i in at else a for i, a in enumerate(args))
        return args, {k: v.reshape(()) if k in by_name else v for k, v in kwargs.items()}

    return pm.register_forward_pre_hook(to_scalars, with_kwargs=True)


def explicit_signature(pm: torch.nn.Module, node: Node) -> None:
    """`pm.forward(name0, name1, ...)` over the IR inputs instead of `*inputs` (module docstring)."""
    names = input_names(node)
    if not all(n.isidentifier() for n in names):
        from difflet.errors import DiffletError

        raise DiffletError(f"{node.name!r}: IR input names {names} are not all Python identifiers, which "
                           "NxD's keyword inputs need", where=node.loc)
    inner = pm.forward  # the class's forward, bound: `*inputs` in IR order

    def forward(*args, **kwargs):
        missing = [n for n in names[len(args):] if n not in kwargs]
        if missing or len(args) + len(kwargs) != len(names):
            raise TypeError(f"{node.name} takes {names}, got {len(args)} positional and {sorted(kwargs)}")
        return inner(*args, *(kwargs[n] for n in names[len(args):]))

    forward.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])
    pm.forward = forward  # an instance attribute: nn.Module.__call__ and inspect.signature see it
