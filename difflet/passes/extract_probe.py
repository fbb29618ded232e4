"""extract-probe: add the caching probe as a top-level `probe` node (mode separate | fused).

It uses op `probe` (not `component`) because its program contract differs: aliased device
state in, one scalar out. Invariants of the probe node (name "probe", attrs role "probe";
otherwise the attrs and body schema of a component):
- it runs the denoiser's input projection, time/condition embedding and the first block's
  normalization and modulation (`modules`), and stops before the first attention
  (`stops_before`); codegen builds it from the denoiser's class and weights (`source`).
- inputs: the denoiser's inputs (codegen prunes the unused ones) plus `prev_feature`, a
  device-resident state (attr state="device"); outputs: `score` (float32 scalar, relative L1
  change of the feature: mean|f - prev| / mean|prev|) and `feature`, aliased onto
  `prev_feature` (attr alias), so only one scalar returns to the host per step.
- mode "separate": its own program with its own (replicated, tp1) layout and cache key;
  mode "fused": the same computation inside the denoiser program, whose attrs gain
  probe="fused" (so the denoiser's cache key changes, as it must: its program changes).
"""
from __future__ import annotations

import msgspec

from difflet.errors import DiffletError
from difflet.ir.nodes import Attrs, Module, Node, Op, TensorType, Value
from difflet.passes import model_facts as F
from difflet.passes.layout_attrs import Layout
from difflet.passes.parallel_config import ParallelConfig
from difflet.passes.plan_parallel import layout_for
from difflet.passes.split_rules import rules_for

PROBE_MODES = ("none", "separate", "fused")


def extract_probe(module: Module, mode: str = "none") -> Module:
    if mode not in PROBE_MODES:
        raise DiffletError(f"unknown probe mode {mode!r}; expected one of {', '.join(PROBE_MODES)}",
                           where="--probe", snippet=mode)
    body = [n for n in module.body if n.op != Op.PROBE]
    if mode == "none":
        return msgspec.structs.replace(module, body=tuple(body))
    dens = [n for n in body if n.op == Op.COMPONENT and n.attrs.get("role") == "denoiser"]
    if not dens:
        raise DiffletError("--probe needs a denoiser component, and this module has none",
                           where=module.attrs.get("source", module.name))
    den = dens[0]
    rules = rules_for(den.attrs.get("class", "")) or {}
    if "probe" not in rules:
        raise DiffletError(f"no probe extraction rule for class {den.attrs.get('class')!r}",
                           where=den.loc)
    probe = _probe_component(module, den, mode, rules["probe"])
    out = []
    for n in body:
        if n is den and mode == "fused":
            n = msgspec.structs.replace(n, attrs=n.attrs.set(probe="fused"))
        out.append(n)
        if n.name == den.name:
            out.append(probe)
    return msgspec.structs.replace(module, body=tuple(out))


def _probe_component(module: Module, den: Node, mode: str, modules: tuple) -> Node:
    hs = F.input_type(den, "hidden_states")
    batch = hs.shape[0] if hs is not None and hs.shape else 1
    dtype = den.attrs.get("dtype", "float32")
    feat = TensorType(dtype, (batch, F.stream_tokens(den, "visual"), F.hidden_size(den)))
    sites = F.attention_sites(den)
    inputs = [n for n in den.body if n.op == Op.INPUT]
    inputs.append(Node(Op.INPUT, "prev_feature", Attrs(state="device"),
                       results=(Value("prev_feature", feat),), loc=den.loc))
    outputs = [
        Node(Op.OUTPUT, "score", Attrs(select=0), results=(Value("score", TensorType("float32", ())),),
             loc=den.loc),
        Node(Op.OUTPUT, "feature", Attrs(select=1, alias="prev_feature"),
             results=(Value("feature", feat),), loc=den.loc),
    ]
    attrs = {"role": "probe", "mode": mode, "source": den.name, "class": den.attrs.get("class"),
             "subfolder": den.attrs.get("subfolder")}
    if "config" in den.attrs:
        attrs["config"] = den.attrs["config"]
    attrs.update(entry="probe", dtype=dtype, modules=tuple(modules),
                 stops_before=sites[0].name if sites else None, score="rel_l1")
    if mode == "fused":
        attrs["fused_into"] = den.name
    comp = Node(Op.PROBE, "probe", Attrs(attrs), body=tuple(inputs + outputs), loc=den.loc)
    world = Layout.of(module.attrs["parallel"]).world if "parallel" in module.attrs else 1
    layout = layout_for(module, comp, ParallelConfig(), world)
    return msgspec.structs.replace(comp, body=comp.body + (layout,))
