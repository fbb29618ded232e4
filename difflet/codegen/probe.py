"""The step-caching probe program: built from the denoiser's class, compiled with its own cache key.

The planned IR's top-level `probe` node (extract-probe, mode "separate") describes it. Invariants:
- The program is what the denoiser class's family declares (`ProbeDecl`: the inputs it reads and
  its module, e.g. input projection, embeddings and the first block's norm1, stopping before
  attention), with the denoiser's checkpoint weights for exactly those modules (so it loads
  only what it runs). Which classes have a probe is difflet/passes/built.py `probe_built()`.
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

from difflet.codegen.decl import ProbeDecl
from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Node, Op

PROBE_NAME = "probe"


def probe_facts(node: Node) -> ProbeDecl:
    """The probe declaration of the denoiser's class (its family's programs.py declares it)."""
    from difflet.codegen.declarations import declaration

    facts = declaration(str(node.attrs.get("class"))).probe
    if facts is None:  # passes/built.py says built, yet no family says how: a registry bug
        raise DiffletError(f"{node.attrs.get('class')} is listed in its family facts' probe_built but "
                           "its family's programs.py declares no probe", where=node.loc)
    return facts


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
    used = [name for name in probe_facts(node).inputs if name in declared]
    inputs = [n for n in node.find(Op.INPUT) if n.name in used and n.attrs.get("state") is None]
    outputs = [n for n in node.find(Op.OUTPUT) if n.attrs.get("alias") is None]
    return msgspec.structs.replace(node, body=tuple(inputs + outputs))


def build_probe_module(node: Node, ckpt_dir) -> torch.nn.Module:
    """The probe's torch module from the denoiser checkpoint (only the probe's modules are kept)."""
    from difflet.codegen.checkpoint import load_component

    view = program_view(node)
    model = load_component(node, ckpt_dir)
    feature = [n for n in node.find(Op.OUTPUT) if n.attrs.get("alias") is not None][0].results[0].type
    probe = probe_facts(node).build(model, tuple(feature.shape), [n.name for n in view.find(Op.INPUT)]).eval()
    del model
    return probe


class ProbeProgram:
    """A loaded probe: `probe(values) -> float` with `values` keyed by denoiser input name."""

    def __init__(self, node: Node, runner: Callable[..., tuple]) -> None:
        from difflet.codegen.program import Program

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
