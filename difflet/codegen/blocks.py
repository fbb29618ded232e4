"""Block mode's two programs of one denoiser: the front (its first k blocks) and the rest.

Both are the denoiser's own program module (the family wrapper over the diffusers model) with
some blocks stood in for by `StandIn`s, which hold no tensors: each keeps exactly the modules it
runs under their checkpoint names, so the two programs' constants are disjoint-or-shared keys of
one weights file (loaded once at serving).

Invariants (tests/test_blocks.py checks them for every family against the whole diffusers module):
- A block's streams are the named tensors it returns (`BlockDecl.outputs`, in its return order);
  a stand-in binds its call to the block's own forward signature and returns its input streams.
- front(*ir_inputs, *residuals) -> (*ir_outputs, *streams): blocks [k, N) stand in; the streams
  after block k - 1 come out; the last stand-in adds `residual_<s>` to each tail stream `s`
  (`BlockDecl.tail`: what the output layers read), so the front's IR outputs are the output layers
  applied to front streams + residuals: the whole denoiser's output when the residuals are the
  rest's, and with zero residuals nothing the runtime uses.
- rest(*ir_inputs, *streams) -> (*ir_outputs, *residuals): blocks [0, k - 1) stand in, block
  k - 1 returns the given streams, blocks [k, N) run; residual_<s> = its last block's stream s
  minus the given one. So front(inputs, rest residuals) and rest(inputs, front streams) both give
  the whole denoiser's outputs (up to float rounding of the residual add).
- Embeddings and output layers run in both programs (they are a few percent of one block).
"""
from __future__ import annotations

import inspect

import torch

from difflet.codegen.block_programs import FRONT
from difflet.codegen.decl import BlockDecl
from difflet.errors import DiffletError


class StandIn(torch.nn.Module):
    """Takes a block's place: returns its input streams (or `given`), plus `residual` on the tail."""

    def __init__(self, block: torch.nn.Module, decl: BlockDecl, holder: "BlockModule") -> None:
        super().__init__()
        self.signature = inspect.signature(block.forward)
        self.decl = decl
        self.holder = [holder]  # a list: not a submodule (no state-dict keys, no cycle)
        self.role = "pass"      # "pass" | "capture" (front's first) | "inject" (rest's k-1)
        self.add_residual = False

    def forward(self, *args, **kwargs):
        holder = self.holder[0]
        bound = self.signature.bind(*args, **kwargs).arguments
        streams = [bound[name] for name in self.decl.outputs]
        if self.role == "capture":
            holder.captured = streams
        elif self.role == "inject":
            streams = list(holder.given)
        if self.add_residual:
            streams = [s + holder.residuals[name] if name in holder.residuals else s
                       for name, s in zip(self.decl.outputs, streams)]
        return streams[0] if len(streams) == 1 else tuple(streams)


def block_list(model: torch.nn.Module, decl: BlockDecl) -> list[tuple[torch.nn.ModuleList, int]]:
    """Every block in call order as (its ModuleList, index)."""
    out = []
    for path in decl.stacks:
        stack = model.get_submodule(path)
        out += [(stack, i) for i in range(len(stack))]
    return out


class BlockModule(torch.nn.Module):
    """The front or the rest of a denoiser program module `pm` (whose `.model` is the diffusers
    model), cut at block k; its parameters keep the names they have in `pm`."""

    def __init__(self, pm: torch.nn.Module, decl: BlockDecl, k: int, part: str) -> None:
        super().__init__()
        blocks = block_list(pm.model, decl)
        if not 1 <= k < len(blocks):
            raise DiffletError(f"front_blocks {k} must be in [1, {len(blocks) - 1}]: the denoiser has "
                               f"{len(blocks)} blocks ({', '.join(decl.stacks)})", where="front_blocks")
        self.pm, self.decl, self.k, self.part = pm, decl, k, part
        self.streams = decl.outputs
        self.captured: list[torch.Tensor] = []
        self.given: list[torch.Tensor] = []
        self.residuals: dict[str, torch.Tensor] = {}
        cut = range(k, len(blocks)) if part == FRONT else range(k)
        stand_ins = []
        for i in cut:
            stack, j = blocks[i]
            stand_ins.append(StandIn(stack[j], decl, self))
            stack[j] = stand_ins[-1]
        if part == FRONT:
            stand_ins[0].role = "capture"
            stand_ins[-1].add_residual = True
        else:
            stand_ins[-1].role = "inject"
            stack, j = blocks[-1]
            stack[j].register_forward_hook(self._capture_last)

    def _capture_last(self, module, args, out) -> None:
        self.captured = list(out) if isinstance(out, (tuple, list)) else [out]

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = len(self.decl.tail) if self.part == FRONT else len(self.streams)
        inputs, extra = tensors[:len(tensors) - n], tensors[len(tensors) - n:]
        if self.part == FRONT:
            self.residuals = dict(zip(self.decl.tail, extra, strict=True))
        else:
            self.given = list(extra)
        try:
            outputs = tuple(self.pm(*inputs))
            captured = self.captured
        finally:
            self.captured, self.given, self.residuals = [], [], {}
        if self.part == FRONT:
            return (*outputs, *captured)
        by_name = dict(zip(self.streams, captured, strict=True))
        given = dict(zip(self.streams, extra, strict=True))
        return (*outputs, *(by_name[s] - given[s] for s in self.decl.tail))


def stream_shapes(front: BlockModule, inputs: tuple) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """The (shape, dtype) of each stream after block k - 1, from one eager run of the front
    without residuals (its extra inputs' and outputs' types)."""
    if front.part != FRONT:
        raise ValueError("stream_shapes runs a front")
    try:
        with torch.no_grad():
            front.pm(*inputs)
        captured = front.captured
    finally:
        front.captured = []
    return [(tuple(t.shape), t.dtype) for t in captured]
