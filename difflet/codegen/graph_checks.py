"""What every Neuron (trn2) graph must satisfy, checked on CPU on the graph codegen exports.

For each component of a lowered or planned module, the program module is built exactly as codegen
builds it (`build.wrap_program_module`: Difflet attention, float64-free RoPE, family wrappers) and
exported with codegen's own `inductor.export_program`. Then, on every node of the exported graph
(and of any subgraph):

- float64: no op result, parameter, buffer or constant is float64/complex128 (NeuronCore-v3 has
  no FP64 unit; neuronx-cc would have to emulate or reject it);
- static shapes: every dimension is a Python int (Neuron compiles one static-shape program per
  input shape; a symbolic dimension means a recompile per shape or a trace failure);
- no data-dependent control flow: no higher-order control-flow op (torch.cond, while_loop, ...)
  and no unbacked symbol (nonzero, item-sized tensors). AWS Neuron docs ("Neuron Control Flow",
  general/arch/neuron-features/control-flow): control flow "is still not implemented by the Neuron
  Compiler"; a runtime branch must become two programs chosen on the host, which is what codegen
  builds on such a target for a class that declares its branch input (codegen/branches.py), so
  those components are checked per branch program, as compiled;
- attention head_dim <= the target table's `max_head_dim` (NKI attention_cte: d <= 128).

Invariant: the checks read only the exported graph and the IR; they never compile, so they run
in CI without the Neuron SDK. Real-size components are built on the meta device (no weights,
no memory), so the same checks cover descriptions whose weights would not fit here.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from difflet.ir.nodes import Module, Node, Op

FP64 = (torch.float64, torch.complex128)


@dataclass(frozen=True)
class Finding:
    """One violation: where in the DSL (component loc), which op, where in Python, and why."""
    component: str
    loc: str
    rule: str
    op: str
    source: str

    def __str__(self) -> str:
        src = f" (at {self.source})" if self.source else ""
        return f"{self.loc}: component {self.component!r}: {self.rule}: {self.op}{src}"


def _source(node: torch.fx.Node) -> str:
    """file:line of the innermost Python frame that made this graph node."""
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    frames = [line.strip() for line in trace if line.strip().startswith("File ")]
    # torch's own and generated frames (<eval_with_key>) say nothing about which model code made the op
    # and portable_ops.py's mode wraps every op of a program module: its frame is not the op's source
    useful = [f for f in frames if '"<' not in f and "site-packages/torch/" not in f and "portable_ops.py" not in f]
    if not useful:
        return ""
    parts = useful[-1].split('"')
    path = parts[1] if len(parts) > 2 else useful[-1]
    line = useful[-1].rsplit("line ", 1)[-1].split(",")[0]
    return f"{_short(path)}:{line}"


def _short(path: str) -> str:
    marker = "site-packages/"
    return path.split(marker, 1)[1] if marker in path else os.path.relpath(path) if path.startswith("/") else path


def _vals(node: torch.fx.Node) -> list:
    v = node.meta.get("val")
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _graphs(gm: torch.fx.GraphModule):
    yield gm.graph
    for _, sub in gm.named_modules():
        if sub is not gm and isinstance(sub, torch.fx.GraphModule):
            yield sub.graph


def check_exported(comp: Node, ep: torch.export.ExportedProgram) -> list[Finding]:
    """The float64, static-shape and control-flow rules on one exported program (module docstring)."""
    loc, out, seen = str(comp.loc), [], set()
    from difflet.codegen.branches import branch_label

    label = branch_label(comp)  # a branch program says which

    def add(rule: str, op: str, source: str) -> None:
        if (rule, op, source) not in seen:
            seen.add((rule, op, source))
            out.append(Finding(label, loc, rule, op, source))

    for name, t in [*ep.state_dict.items(), *ep.constants.items()]:
        if isinstance(t, torch.Tensor) and t.dtype in FP64:
            add("float64 tensor", f"{name} ({t.dtype})", "")
    for graph in _graphs(ep.graph_module):
        for n in graph.nodes:
            target = str(getattr(n.target, "__name__", n.target)) if n.op == "call_function" else n.name
            if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator) \
                    and n.target.name() in ("cond", "while_loop", "scan", "map_impl", "associative_scan"):
                add("data-dependent control flow (not implemented by neuronx-cc: compile one program "
                    "per branch and choose on the host)", f"torch.{n.target.name()}", _source(n))
            if n.meta.get("unbacked_bindings"):
                add("data-dependent shape (unbacked symbol)", target, _source(n))
            for v in _vals(n):
                if not isinstance(v, torch.Tensor):
                    continue
                if v.dtype in FP64:
                    add("float64 op", f"{target} -> {v.dtype}", _source(n))
                if not all(isinstance(d, int) for d in v.shape):
                    add("dynamic dimension", f"{target} shape {tuple(v.shape)}", _source(n))
    return out


def check_head_dims(comp: Node, target: dict) -> list[Finding]:
    """Every attention site's head_dim within the target's kernel limit (IR only, no export)."""
    limit = int(target["max_head_dim"])
    return [Finding(comp.name, str(a.loc), f"head_dim above the attention kernel's limit {limit}",
                    f"attention {a.name!r} head_dim {a.attrs['head_dim']}", "")
            for a in comp.find(Op.ATTENTION) if int(a.attrs.get("head_dim", 0)) > limit]


def meta_program(comp: Node):
    """`comp`'s program module with weights on the meta device (real size, no memory) and meta inputs."""
    from difflet.codegen.build import example_inputs, wrap_program_module
    from difflet.codegen.checkpoint import _build_random

    from accelerate import init_empty_weights

    # parameters on meta; buffers real, since wrappers may precompute tables from them (RoPE)
    with init_empty_weights(include_buffers=False):
        model = _build_random(comp, 0).to(getattr(torch, comp.attrs.get("dtype", "float32")))
    pm = wrap_program_module(model.eval(), comp).to("meta")
    return pm, tuple(t.to("meta") for t in example_inputs(comp))


def check_module(module: Module, target: dict, ckpt: str | os.PathLike | None = None,
                 only: tuple[str, ...] = ()) -> dict[str, list[Finding]]:
    """Findings per component (empty list = clean). `ckpt` builds from a checkpoint; None: on meta."""
    from difflet.codegen.branches import branch_views
    from difflet.codegen.build import build_program_module, example_inputs
    from difflet.codegen.inductor import export_program

    result: dict[str, list[Finding]] = {}
    for comp in module.components():
        if only and comp.name not in only:
            continue
        # what codegen compiles for this target: one program per branch value where it has no control flow
        views = branch_views(comp, bool(target.get("control_flow", True)))
        result[comp.name] = check_head_dims(comp, target)
        for _, view in views or [(None, comp)]:
            if ckpt is not None:
                pm, inputs = build_program_module(view, Path(ckpt)), example_inputs(view)
            else:
                pm, inputs = meta_program(view)
            # on meta, tensors a wrapper creates without a device (masks from arange) must be meta too
            with contextlib.nullcontext() if ckpt is not None else torch.device("meta"):
                ep = export_program(view, pm, inputs)
            result[comp.name] += check_exported(view, ep)
            del pm, ep
    return result
