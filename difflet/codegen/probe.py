"""The step-caching probe program: built from the denoiser's class, compiled with its own cache key.

The planned IR's top-level `probe` node (extract-probe, mode "separate") describes it. Invariants:
- The program runs the denoiser's input projection, timestep/guidance/pooled embedding and the
  first block's norm1 (AdaLayerNormZero), stopping before attention, with the denoiser's
  checkpoint weights for exactly those modules (so it loads only what it runs).
- Its compiled signature is the IR's, pruned: the denoiser inputs the computation uses, in IR
  order, in; `score` (0-d float32, mean|f - prev| / mean|prev|) out. The IR's `prev_feature`
  (state="device") is a registered buffer, and `feature` (alias="prev_feature") is its in-place
  update: torch.export + AOTInductor keep the buffer mutation inside the loaded program (checked
  by tests/test_stepcache_probe.py), so the feature never crosses to the host and only one scalar
  returns per call.
- The state is per program, not per request: a request's first call compares against the
  previous request's last feature, and the host never reads that first score (calibrated mode
  keeps at least one initial full step), so no output depends on an earlier request.
- Codegen stores the probe under its own cache key; adding a probe compiles only the probe.
  The manifest lists it among its components with role "probe" (and `source`, the denoiser),
  and `load_artifacts` loads it like every other program, wrapped in a `ProbeProgram`.
"""
from __future__ import annotations

from typing import Any, Callable

import msgspec
import torch

from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Node, Op

PROBE_NAME = "probe"
# denoiser class -> the denoiser inputs its probe computation reads, in the order forward takes them
USED_INPUTS = {"FluxTransformer2DModel": ("hidden_states", "timestep", "pooled_projections", "guidance")}


def _class_name(node: Node) -> str:
    return str(node.attrs.get("class", "")).rpartition(".")[2]


def probe_node(module: Module) -> Node | None:
    """The module's separate probe node, or None; a fused probe is refused (not built here)."""
    found = module.find(Op.PROBE)
    if not found:
        return None
    from difflet.passes.built import probe_reason

    node = found[0]
    reason = probe_reason(node)  # the planner's verdict (difflet/passes/built.py)
    if reason:
        raise DiffletError(reason, where="--probe" if node.attrs.get("mode") != "separate" else node.loc)
    return node


def program_view(node: Node) -> Node:
    """The probe node as its compiled program sees it: used, non-state inputs; unaliased outputs."""
    declared = {n.name for n in node.find(Op.INPUT)}
    used = [name for name in USED_INPUTS[_class_name(node)] if name in declared]
    inputs = [n for n in node.find(Op.INPUT) if n.name in used and n.attrs.get("state") is None]
    outputs = [n for n in node.find(Op.OUTPUT) if n.attrs.get("alias") is None]
    return msgspec.structs.replace(node, body=tuple(inputs + outputs))


class FluxProbe(torch.nn.Module):
    """FluxTransformer2DModel up to the first block's norm1 output, with the saved feature."""

    def __init__(self, model: torch.nn.Module, feature_shape: tuple[int, ...], inputs: list[str]) -> None:
        super().__init__()
        self.x_embedder = model.x_embedder
        self.time_text_embed = model.time_text_embed
        self.norm1 = model.transformer_blocks[0].norm1
        self.inputs = inputs
        dtype = self.x_embedder.weight.dtype
        self.register_buffer("prev_feature", torch.zeros(feature_shape, dtype=dtype))

    STATE, OUTPUTS = ("prev_feature",), 1  # compute() returns (score, new prev_feature)

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor]:
        score, feature = self.compute(*args)
        self.prev_feature.copy_(feature)  # in place: export records a buffer mutation
        return (score,)

    def compute(self, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(score, new feature) without touching the state (neuron aliases the state as an output)."""
        named = dict(zip(self.inputs, args, strict=True))
        hidden = self.x_embedder(named["hidden_states"])
        # the same scaling as FluxTransformer2DModel.forward
        timestep = named["timestep"].to(hidden.dtype) * 1000
        if "guidance" in named:
            temb = self.time_text_embed(timestep, named["guidance"].to(hidden.dtype) * 1000,
                                        named["pooled_projections"])
        else:
            temb = self.time_text_embed(timestep, named["pooled_projections"])
        feature = self.norm1(hidden, emb=temb)[0]
        prev = self.prev_feature.float()
        score = (feature.float() - prev).abs().mean() / prev.abs().mean().clamp_min(1e-30)
        return score, feature


def build_probe_module(node: Node, ckpt_dir) -> torch.nn.Module:
    """The probe's torch module from the denoiser checkpoint (only the probe's modules are kept)."""
    from difflet.codegen.checkpoint import load_component

    view = program_view(node)
    model = load_component(node, ckpt_dir)
    feature = [n for n in node.find(Op.OUTPUT) if n.attrs.get("alias") is not None][0].results[0].type
    probe = FluxProbe(model, tuple(feature.shape), [n.name for n in view.find(Op.INPUT)]).eval()
    del model
    return probe


class ProbeProgram:
    """A loaded probe: `probe(values) -> float` with `values` keyed by denoiser input name."""

    def __init__(self, node: Node, runner: Callable[..., tuple]) -> None:
        from difflet.codegen.artifacts import Program

        self.node = node
        self.view = program_view(node)
        self.program = Program(self.view, runner)
        self._inputs = [(n.name, n.results[0].type) for n in self.view.find(Op.INPUT)]

    def __call__(self, values: dict[str, Any]) -> float:
        args = [torch.as_tensor(values[name]).to(getattr(torch, t.dtype)).contiguous()
                for name, t in self._inputs]
        (score,) = self.program(*args)
        return float(score)


def eager_probe(module: Module, ckpt_dir) -> ProbeProgram | None:
    """The uncompiled probe (same call convention as the compiled one), or None without a probe."""
    node = probe_node(module)
    return None if node is None else ProbeProgram(node, build_probe_module(node, ckpt_dir))
