"""The generic program module: a component model wrapped to the program calling convention
(IR inputs positionally, runtime values routed as joint_attention_kwargs, IR outputs selected).
A leaf: family wrappers build on it without reaching the declarations.
"""
from __future__ import annotations

import torch

from difflet.codegen.program import program_inputs
from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op, RuntimeType


class ProgramModule(torch.nn.Module):
    """The component model wrapped to the program calling convention (see module docstring)."""

    def __init__(self, model: torch.nn.Module, node: Node) -> None:
        super().__init__()
        self.model = model
        self.entry = node.attrs.get("entry", "forward")
        if not callable(getattr(model, self.entry, None)):
            raise DiffletError(f"{node.attrs['class']} has no method {self.entry!r}", where=node.loc)
        self.input_names = [v.name for v in program_inputs(node)]
        self.runtime = [isinstance(v.type, RuntimeType) for v in program_inputs(node)]
        self.selects = [n.attrs.get("select", 0) for n in node.find(Op.OUTPUT)]
        self.joint_kwargs = bool(node.find(Op.ATTENTION))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kwargs, runtime = {}, {}
        for name, is_runtime, value in zip(self.input_names, self.runtime, inputs, strict=True):
            (runtime if is_runtime else kwargs)[name] = value
        if runtime:
            kwargs["joint_attention_kwargs"] = runtime
        result = getattr(self.model, self.entry)(**kwargs)
        return tuple(_select(result, sel) for sel in self.selects)


def _select(result, sel):
    """Output `sel` of `result`: an index, a field name, or a dotted path of attributes and
    indices ("latent_dist.parameters": a VAE encoder's mean | logvar, sampled on the host;
    "hidden_states.-2": the penultimate layer's hidden states)."""
    if isinstance(sel, int):
        return result[sel] if isinstance(result, (tuple, list)) else result.to_tuple()[sel]
    for name in sel.split("."):
        if name.lstrip("-").isdigit() and isinstance(result, (tuple, list)):
            result = result[int(name)]
        else:
            result = getattr(result, name) if hasattr(result, name) else result[name]
    return result
