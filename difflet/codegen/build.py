"""Build the torch module a component's program runs: the IR's inputs in, the IR's outputs out.

Invariants:
- `forward(*inputs)` takes the component's IR inputs positionally, in IR order; a runtime input
  is a 0-d int64 tensor. It returns a tuple with one tensor per IR output, in IR order.
- Tensor inputs are passed to the class's `entry` method by keyword (the input's name); runtime
  inputs of a denoiser go through `joint_attention_kwargs` to Difflet's attention processors.
- Each output is `result[select]` (an int index or a field name of the class's return value).
- `backend` picks the attention kernel every Difflet processor calls (kernels/select.py); None is
  the fused SDPA path, what inductor programs run. The choice lives in the module built.
"""
from __future__ import annotations

import os

import torch

from difflet.codegen.attention import install_attention
from difflet.codegen.checkpoint import load_component
from difflet.codegen.portable_ops import install_portable_ops
from difflet.codegen.program_module import ProgramModule
from difflet.codegen.program import program_inputs
from difflet.codegen.rope import install_fp32_rope
from difflet.errors import DiffletError
from difflet.kernels.select import attention_kernel
from difflet.ir.nodes import Node, Op, RuntimeType


def build_program_module(node: Node, ckpt_dir: str | os.PathLike, backend: str | None = None) -> ProgramModule:
    """Load the component from the checkpoint, install Difflet attention (denoisers), wrap it."""
    return wrap_program_module(load_component(node, ckpt_dir), node, backend)


def wrap_program_module(model: torch.nn.Module, node: Node, backend: str | None = None) -> torch.nn.Module:
    """Install Difflet attention on a loaded (or meta-device) component model and wrap it."""
    from difflet.codegen.declarations import declaration

    wrap = declaration(node.attrs["class"]).wrapper
    runtime_inputs = [v.name for v in program_inputs(node) if isinstance(v.type, RuntimeType)]
    if runtime_inputs and not node.find(Op.ATTENTION) and wrap is None:
        raise DiffletError(f"component {node.name!r} takes runtime inputs {runtime_inputs} but has no "
                           "attention sites or program wrapper to route them to", where=node.loc)
    install_attention(model, node, attention_kernel(backend))
    install_fp32_rope(model)  # Neuron has no FP64: RoPE tables without float64 ops
    pm = wrap(model, node) if wrap is not None else ProgramModule(model, node)
    return install_portable_ops(pm).eval()  # ops every backend lowers (portable_ops.py)


def example_inputs(node: Node) -> tuple[torch.Tensor, ...]:
    """Deterministic example tensors of the IR input types (runtime values at their upper bound)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for v in program_inputs(node):
        t = v.type
        if isinstance(t, RuntimeType):
            out.append(torch.tensor(t.hi, dtype=getattr(torch, t.dtype)))
        elif t.dtype.startswith("int") or t.dtype.startswith("uint"):
            out.append(torch.randint(0, 8, t.shape, generator=gen, dtype=getattr(torch, t.dtype)))
        else:
            out.append(torch.randn(t.shape, generator=gen).to(getattr(torch, t.dtype)))
    return tuple(out)
