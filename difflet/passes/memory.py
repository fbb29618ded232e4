"""Memory model: estimated bytes per core of a planned module on a target.

A deliberately simple, documented model (every rank is symmetric, so one core stands for all):
- weights, for every resident component (all share the same cores): its split linears
  (`params_blocks_linear`) / its tp, plus the rest (`params - params_blocks_linear`) replicated,
  times the bytes of its dtype. A component without `params_blocks_linear` counts as
  fully replicated.
- denoiser activations at the profile's sequence length, batch 1 per call (CFG branches run
  as separate calls or on separate cfg groups), lengths rounded up to the target's tile:
  4 residual-width buffers (residual, normed/modulated input, attention output, block output)
  over the tokens a rank holds between linears (/tp under SP), local-head Q/K/V/O and the MLP
  intermediate (/tp) over the rank's tokens, the attention mode's extra buffers (passes/cp_modes.py
  `held`: Ulysses the full-sequence q/k/v of its heads, Ring two in-flight visual partitions of
  K/V, gather_kv all visual K/V), and the score matrix only where the target materializes it.
- the probe: its saved feature (visual tokens x hidden) and, for a separate program, its
  weights (non-block params plus one block's linears: an upper bound).
- the target's reserved bytes (runtime, collective buffers).
Encoder and decoder activations are not counted: they run outside the denoise loop and are
small next to its buffers at these profiles.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from difflet.ir.nodes import Module, Node, Op
from difflet.passes import cp_modes
from difflet.passes import model_facts as F
from difflet.passes.layout_attrs import Layout, PlannedSite, layout_node

GIB = 1 << 30


@dataclass
class MemoryEstimate:
    """Bytes per core, itemized as (component, item, bytes) in a stable order."""

    items: list[tuple[str, str, int]] = field(default_factory=list)
    capacity: int = 0

    @property
    def total(self) -> int:
        return sum(b for _, _, b in self.items)

    def fits(self) -> bool:
        return self.total <= self.capacity

    def summary(self) -> str:
        return f"{self.total / GIB:.1f} of {self.capacity / GIB:.0f} GiB per core"

    def breakdown(self) -> str:
        rows = [f"  {c:<16} {what:<28} {b / GIB:7.2f} GiB" for c, what, b in self.items]
        return "\n".join(rows + [f"  {'total':<45} {self.total / GIB:7.2f} GiB "
                                 f"(capacity {self.capacity / GIB:.0f} GiB)"])


def weight_bytes(comp: Node, tp: int) -> int:
    params = int(comp.attrs.get("params") or 0)
    split = int(comp.attrs.get("params_blocks_linear") or 0) if tp > 1 else 0
    return (split // tp + params - split) * F.dtype_bytes(comp.attrs.get("dtype", "float32"))


def _activation_bytes(comp: Node, layout: Node, target: Mapping[str, Any]) -> list[tuple[str, int]]:
    tile, b = int(target["tile_tokens"]), F.dtype_bytes(comp.attrs.get("dtype", "float32"))
    la = Layout.of(layout)
    local = la.local_tokens
    streams = [F.round_up(local[s], tile) for s in ("visual", "text", "audio") if local.get(s)]
    tokens = sum(streams)
    between = sum(F.round_up(v // la.tp, tile) for v in streams) if la.sp else tokens
    hidden, mlp = F.hidden_size(comp), F.mlp_hidden(comp)
    out = [("residual buffers", 4 * between * hidden * b),
           ("q/k/v/o + mlp (local)", tokens * (4 * hidden + mlp) // la.tp * b)]
    extra, scores = 0, 0
    for site in map(PlannedSite.of, layout.find(Op.ATTENTION)):
        q, kv = F.round_up(site.q_len, tile), F.round_up(site.kv_len, tile)
        held_q, held_kv = cp_modes.MODES[site.mode].held
        extra = max(extra, (held_q * q + held_kv * kv) * site.heads_local * site.head_dim * b)
        if target["materializes_scores"]:
            scores = max(scores, site.heads_local * q * kv * b)
    if extra:
        out.append((f"{la.attention} k/v", extra))
    if scores:
        out.append(("attention scores", scores))
    return out


def _probe_bytes(module: Module, probe: Node) -> list[tuple[str, int]]:
    den = module.component(probe.attrs["source"])
    b = F.dtype_bytes(den.attrs.get("dtype", "float32"))
    feature = F.stream_tokens(den, "visual") * F.hidden_size(den) * b
    out = [("saved feature", feature)]
    if probe.attrs.get("mode") == "separate":
        params = int(den.attrs.get("params") or 0)
        blocks = int(den.attrs.get("params_blocks_linear") or 0)
        n = max(1, int(den.attrs.get("num_blocks") or F.config(den).get("num_layers") or 1))
        out.append(("weights (upper bound)", (params - blocks + blocks // n) * b))
    return out


def estimate(module: Module, target: Mapping[str, Any]) -> MemoryEstimate:
    """Per-core estimate of a planned module (every component must have a layout).

    Every component's weights are resident; of several denoisers (Wan 2.2 A14B's experts, which
    run one step at a time) only the largest activations count: the Neuron runtime gives all NEFFs
    loaded on a core one shared scratchpad the size of the largest (aws-neuron-sdk
    neuron-runtime/explore/device-memory.rst, "Shared scratchpad")."""
    est = MemoryEstimate(capacity=int(float(target["memory_per_core_gib"]) * GIB))
    live: list[list[tuple[str, str, int]]] = []
    for comp in F.compiled(module):
        layout = layout_node(comp)
        if comp.attrs.get("role") == "probe":
            est.items += [(comp.name, what, n) for what, n in _probe_bytes(module, comp)]
            continue
        tp = Layout.of(layout).tp if layout is not None else 1
        est.items.append((comp.name, f"weights (tp{tp})", weight_bytes(comp, tp)))
        if comp.attrs.get("role") == "denoiser" and layout is not None:
            live.append([(comp.name, what, n) for what, n in _activation_bytes(comp, layout, target)])
    est.items += max(live, key=lambda items: sum(n for *_, n in items), default=[])
    est.items.append(("runtime", "reserved", int(float(target["reserved_per_core_gib"]) * GIB)))
    return est
