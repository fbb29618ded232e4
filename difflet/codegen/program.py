"""The program call convention, shared by compiled, eager and split programs.

Invariants:
- A program takes its component's IR inputs positionally, in IR order, and returns a tuple with
  one tensor per IR output, in IR order; a runtime input is a 0-d int64 tensor in its range.
- This module imports nothing of codegen or parallel (torch only inside functions), so both
  the artifact loader and parallel/workers.py (SplitProgram) use it without importing back.
"""
from __future__ import annotations

from typing import Callable

from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op, RuntimeType, Value


def program_inputs(node: Node) -> list[Value]:
    return [n.results[0] for n in node.find(Op.INPUT)]


def program_outputs(node: Node) -> list[Value]:
    return [n.results[0] for n in node.find(Op.OUTPUT)]


def check_inputs(node: Node, inputs: tuple) -> None:
    """Raise DiffletError when `inputs` do not match the component's IR input types."""
    import torch

    values = program_inputs(node)
    if len(inputs) != len(values):
        raise DiffletError(f"{node.name} takes {len(values)} inputs ({', '.join(v.name for v in values)}), "
                           f"got {len(inputs)}", where=node.name)
    for v, x in zip(values, inputs):
        if not isinstance(x, torch.Tensor):
            raise DiffletError(f"input {v.name} must be a tensor, got {type(x).__name__}", where=v.name)
        t = v.type
        if isinstance(t, RuntimeType):
            if x.dim() != 0 or x.dtype != getattr(torch, t.dtype) or not t.lo <= int(x) <= t.hi:
                raise DiffletError(f"runtime input {v.name} must be a 0-d {t.dtype} in [{t.lo}, {t.hi}], "
                                   f"got {tuple(x.shape)} {x.dtype} {x.tolist()}", where=v.name)
        elif tuple(x.shape) != tuple(t.shape) or x.dtype != getattr(torch, t.dtype):
            raise DiffletError(f"input {v.name} must be {t.dtype}{list(t.shape)}, got "
                               f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}", where=v.name)


class Program:
    """One component's callable program: `program(*tensors) -> tuple[Tensor, ...]` in IR order.

    Inputs are checked against the IR types (runtime values: 0-d int64 in their range; a Python
    int is accepted and converted) before the call.
    """

    def __init__(self, node: Node, runner: Callable[..., tuple]) -> None:
        self.node = node
        self.name = node.name
        self.inputs: list[Value] = program_inputs(node)
        self.outputs: list[Value] = program_outputs(node)
        self._runner = runner

    def __call__(self, *tensors):
        import torch

        tensors = tuple(torch.tensor(t, dtype=getattr(torch, v.type.dtype)) if isinstance(t, int) else t
                        for t, v in zip(tensors, self.inputs))
        check_inputs(self.node, tensors)
        with torch.no_grad():  # not inference_mode: callers may update outputs in place
            return tuple(self._runner(*tensors))

    def close(self) -> None:
        """Stop what the runner holds outside this process (a block-mode split's rank workers)."""
        close = getattr(self._runner, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return f"Program({self.name}: {[v.name for v in self.inputs]} -> {[v.name for v in self.outputs]})"
