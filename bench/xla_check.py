"""Opt-in XLA lowering check: every tiny component lowered to HLO on torch-xla's CPU device.

    bash bench/xla_env.sh                                   # once: /work/xla-venv (torch 2.9 + torch-xla 2.9)
    PJRT_DEVICE=CPU PYTHONPATH=. /work/xla-venv/bin/python bench/xla_check.py \
        [--models flux-tiny ...] [--component NAME ...] [--upload device-data|to|neuron] [--update] \
        [--out bench/results/xla_check]

Not part of the pytest suite: torch-xla pins an older torch than difflet's own environment, so it
runs in its own venv (bench/xla_env.sh). For each component of models/<name>.dsl the program
module is built exactly as codegen builds it (`build.build_program_module` from the random:0
checkpoint: Difflet attention, float64-free RoPE, family wrappers), then:

- eager: run on CPU in torch at every tested runtime value (the reference);
- XLA: the same module moved to the XLA CPU device (PJRT_DEVICE=CPU) and run lazily at the same
  values; torch_xla's `CompileTime` metric counts compilations: one compile must serve every value
  (`compiles` == 1). Inputs are uploaded as device data (`upload`), never with `.to(device)`: a
  0-d CPU tensor moved with `.to` keeps its host value and torch-xla lowers it as a constant when
  it is 0 or +-1 (`IsSpecialScalar`) or as the scalar cache's device data shared with an equal
  graph scalar otherwise (`XLATensor::GetIrValueForTensor`, torch_xla/csrc/tensor.cpp), so the
  runtime value would not be its own program input. `--upload neuron` instead moves them with
  `.to` as torch_neuronx.trace does, runtime values as shape [1] (codegen/neuron_inputs.py);
- max |XLA - eager| over all outputs and values; the HLO of the first call's outputs scanned for
  float64 (bench/xla_hlo.py: instructions with an f64 result; must be 0); CPU-fallback aten ops.

A component that fails to lower is reported with the exception and the innermost model frame,
never skipped. Writes <out>.json and <out>.md (the table the README's Trainium section carries).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import torch  # noqa: E402

from xla_hlo import count_f64, parameters  # noqa: E402

MODELS = ("flux-tiny", "qwen-image-tiny", "wan2.1-tiny", "hunyuan-video-tiny", "ltx2-tiny")


def runtime_values(comp) -> dict[str, list[int]]:
    """Tested values per runtime input: its upper bound, midpoint and lower bound (deduplicated)."""
    from difflet.codegen.program import program_inputs
    from difflet.ir.nodes import RuntimeType

    return {v.name: sorted({v.type.hi, (v.type.lo + v.type.hi) // 2, v.type.lo}, reverse=True)
            for v in program_inputs(comp) if isinstance(v.type, RuntimeType)}


def input_sets(comp) -> list[tuple[dict, tuple]]:
    """(runtime values, inputs) per call: example inputs, runtime inputs stepped together
    (the i-th call uses each runtime input's i-th value, its last when it has fewer)."""
    from difflet.codegen.build import example_inputs
    from difflet.codegen.program import program_inputs

    base, names = example_inputs(comp), [v.name for v in program_inputs(comp)]
    values = runtime_values(comp)
    calls = max((len(v) for v in values.values()), default=1)
    out = []
    for i in range(calls):
        chosen = {k: v[min(i, len(v) - 1)] for k, v in values.items()}
        out.append((chosen, tuple(torch.tensor(chosen[n], dtype=t.dtype) if n in chosen else t
                                  for n, t in zip(names, base))))
    return out


UPLOADS = ("device-data", "to", "neuron")


def upload(inputs, dev, how: str = "device-data", positions=()) -> list[torch.Tensor]:
    """Inputs on the XLA device. device-data: `xm.send_cpu_data_to_device` (real device data, so a
    0-d runtime value is one HLO parameter whatever its value; the default); to: `.to(dev)` (what
    torch_neuronx.trace does, shown for comparison); neuron: `.to(dev)` with the runtime values as
    shape [1], as difflet/codegen/neuron_inputs.py traces and feeds neuron programs."""
    import torch_xla.core.xla_model as xm

    if how == "device-data":
        return xm.send_cpu_data_to_device(list(inputs), dev)
    if how == "neuron":
        from difflet.codegen.neuron_inputs import call_inputs

        inputs = call_inputs(positions, inputs)
    return [t.to(dev) for t in inputs]


def _flat(outs) -> list[torch.Tensor]:
    return [t for t in outs if isinstance(t, torch.Tensor)]


def _where(err: BaseException) -> str:
    """The innermost frame in model code (difflet, diffusers, transformers) that raised."""
    frames = traceback.extract_tb(err.__traceback__)
    useful = [f for f in frames if any(p in f.filename for p in ("difflet/", "diffusers/", "transformers/"))
              and not f.filename.endswith("portable_ops.py")]  # the op-rewriting mode's frame wraps every op
    f = (useful or frames or [None])[-1]
    path = "" if f is None else f.filename.split("site-packages/")[-1].removeprefix(f"{REPO}/")
    return "" if f is None else f"{path}:{f.lineno} ({f.line})"


def host_reads(pm, inputs) -> tuple[list, list[str]]:
    """Run `pm` eagerly, recording where it reads a tensor value on the host (`.item()`, `.all()`
    in an `if`: aten._local_scalar_dense): under lazy tracing each such read runs the graph so far
    and branches on its value, i.e. the program depends on data. Returns (outputs, places)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    places: list[str] = []

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                frames = [f for f in traceback.extract_stack() if "/torch/" not in f.filename
                          and not f.filename.endswith(("xla_check.py", "portable_ops.py"))]
                if frames:
                    f = frames[-1]
                    where = f"{f.filename.split('site-packages/')[-1]}:{f.lineno} ({(f.line or '').strip()})"
                    if where not in places:
                        places.append(where)
            return func(*args, **(kwargs or {}))

    try:
        with torch.no_grad(), Reads():
            return _flat(pm(*inputs)), places
    except NotImplementedError as err:  # torch.cond has no rule for a dispatch mode: run it plainly
        if "HigherOrderOperator" not in str(err):
            raise
    with torch.no_grad():
        return _flat(pm(*inputs)), ["(not recorded: torch.cond runs under no dispatch mode)"]


def compile_count() -> int:
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def check_component(comp, ckpt: Path, how: str = "device-data") -> dict:
    """One component's row (module docstring); raises nothing: failures land in 'error'."""
    import torch_xla
    import torch_xla.debug.metrics as met
    from difflet.codegen.build import build_program_module
    from difflet.codegen.neuron_inputs import runtime_positions, vector_runtime_inputs

    from difflet.codegen.branches import branch_label

    row = {"component": branch_label(comp), "class": comp.attrs["class"], "dtype": comp.attrs.get("dtype", "float32"),
           "runtime_values": runtime_values(comp), "upload": how}
    stage = "build"
    try:
        pm = build_program_module(comp, ckpt)
        calls = input_sets(comp)
        positions = runtime_positions(comp)
        stage = "eager"
        ref, reads = [], []
        for _, inputs in calls:
            outs, places = host_reads(pm, inputs)
            ref.append(outs)
            reads += [p for p in places if p not in reads]
        row["host_reads"] = reads
        if how == "neuron":  # the pre-hook neuron.py / neuron_spmd.py install before tracing
            vector_runtime_inputs(pm, positions)
        stage = "move to XLA"
        dev = torch_xla.device()
        pm = pm.to(dev)
        torch_xla.sync()
        met.clear_counters()
        start, per_call, t0 = compile_count(), [], time.perf_counter()
        for i, (values, inputs) in enumerate(calls):
            stage = f"XLA call {i} {values}"
            before = compile_count()
            with torch.no_grad():
                outs = _flat(pm(*upload(inputs, dev, how, positions)))
            hlo = torch_xla._XLAC._get_xla_tensors_hlo(outs)
            if i == 0:
                row["f64"] = count_f64(hlo)
            torch_xla.sync()
            got = [o.cpu() for o in outs]
            err = max(float((g.double() - r.double()).abs().max()) for g, r in zip(got, ref[i], strict=True))
            per_call.append({"values": values, "compiles": compile_count() - before,
                             "hlo_parameters": parameters(hlo), "max_abs_err": err})
        row.update(calls=len(calls), compiles=compile_count() - start, per_call=per_call,
                   max_abs_err=max(c["max_abs_err"] for c in per_call),
                   ref_max_abs=max(float(r.abs().max()) for r in ref[0]), xla_seconds=time.perf_counter() - t0,
                   fallback_ops=sorted(met.executed_fallback_ops()))
        row["compiled_once"] = row["compiles"] == 1
        most = max(c["hlo_parameters"] for c in per_call)
        row["merged_values"] = [c["values"] for c in per_call if c["hlo_parameters"] < most]
        row["recompiled"] = [_recompile_reason(c, most, reads) for c in per_call[1:] if c["compiles"]]
    except Exception as err:  # a component that does not lower is a result, not a crash
        row["error"] = {"stage": stage, "type": type(err).__name__, "message": str(err).strip()[:600],
                        "where": _where(err)}
    return row


def _recompile_reason(call: dict, most: int, reads: list[str]) -> str:
    """Why a later call compiled again, as far as the HLO shows it."""
    vals = ", ".join(f"{k}={v}" for k, v in call["values"].items())
    if call["hlo_parameters"] < most and not reads:
        return f"{vals}: merged with an equal graph scalar"
    return f"{vals}: a different graph" + (" (it branches on a host read)" if reads else "")


def markdown(rows: list[dict]) -> str:
    head = ("| model | component | runtime values | compiled once (compiles / calls) | max abs error "
            "(output max) | f64 ops in HLO | CPU fallbacks; host reads of tensor values |\n|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        rv = ", ".join(f"{k} {'/'.join(map(str, v))}" for k, v in r["runtime_values"].items()) or "—"
        if "error" in r:
            e = r["error"]
            lines.append(f"| {r['model']} | {r['component']} | {rv} | FAILS at {e['stage']}: {e['type']}: "
                         f"{e['message'].splitlines()[0][:160]} (at {e['where']}) | — | {r.get('f64', {}).get('ops', '—')} | — |")
            continue
        split = r["per_call"][0]["compiles"]
        why = ([f"{split} compiles in the first call (the graph is cut at a CPU fallback or host read)"]
               if split > 1 else []) + r["recompiled"]
        once = "yes" if r["compiled_once"] else "NO: " + "; ".join(why)
        merged = [", ".join(f"{k}={v}" for k, v in m.items()) for m in r["merged_values"]]
        merged = [m for m in merged if f"{m}: merged" not in once]  # not said twice
        if merged:  # traced at that value, the program reads a constant and the input as one parameter
            once += f"; fewer HLO parameters at {' and '.join(merged)}" + (
                "" if r["host_reads"] else " (the runtime input merged with an equal graph scalar)")
        f64 = r["f64"]["ops"]
        f64 = f"{f64}: " + "; ".join(r["f64"]["examples"]) if f64 else "0"
        lines.append(f"| {r['model']} | {r['component']} | {rv} | {once} ({r['compiles']} / {r['calls']}) | "
                     f"{r['max_abs_err']:.1e} ({r['ref_max_abs']:.2g}) | {f64} | "
                     f"{'; '.join(r['fallback_ops'] + r['host_reads']) or 'none'} |")
    return head + "\n".join(lines) + "\n"


def rewrite_markdown(out: str) -> None:
    """OUT.md again from OUT.json (after a change to the table's wording; no XLA needed)."""
    Path(out + ".md").write_text(markdown(json.loads(Path(out + ".json").read_text())["rows"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), help="names under models/ (without .dsl)")
    ap.add_argument("--component", nargs="*", default=(), help="only these component names")
    ap.add_argument("--store", default=None, help="store for the random:0 checkpoints (default $DIFFLET_STORE)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "xla_check"), help="writes OUT.json, OUT.md")
    ap.add_argument("--upload", choices=UPLOADS, default="device-data", help="how inputs reach the device (see upload)")
    ap.add_argument("--update", action="store_true",
                    help="replace only the checked rows in an existing OUT.json (a re-run of a few components)")
    args = ap.parse_args(argv)
    if os.environ.get("PJRT_DEVICE") != "CPU":
        print("set PJRT_DEVICE=CPU (this check runs on torch-xla's CPU device)", file=sys.stderr)
        return 2
    # HLO metadata names the aten op and Python line of each instruction (where an f64 comes from)
    os.environ.setdefault("XLA_IR_DEBUG", "1")
    os.environ.setdefault("XLA_HLO_DEBUG", "1")
    import torch_xla
    from difflet.codegen.branches import branch_views
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.quiet import quiet_libraries
    from difflet.codegen.store import Store
    from difflet.frontend.lower import lower_file

    rows = []
    for name in args.models:
        module = lower_file(str(REPO / "models" / f"{name}.dsl"))
        ckpt = resolve_weights(module, "random:0", Store(args.store).root)
        for comp in module.components():
            if args.component and comp.name not in args.component:
                continue
            # what codegen compiles for trn2 (no control flow): one program per branch value
            for _, view in branch_views(comp, control_flow=False) or [(None, comp)]:
                with quiet_libraries():
                    row = {"model": name, **check_component(view, ckpt, args.upload)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    env = {"torch": torch.__version__, "torch_xla": torch_xla.__version__, "python": sys.version.split()[0],
           "pjrt_device": os.environ["PJRT_DEVICE"],
           "xla_flags": {k: v for k, v in os.environ.items() if k.startswith("XLA_")},
           "upload": args.upload}
    if args.update and Path(args.out + ".json").exists():  # keep the other components' rows, in their order
        def base(r):  # a branch program's row belongs to its component
            return r["model"], r["component"].split(" ")[0]

        checked, merged, placed = {base(r) for r in rows}, [], set()
        for r in json.loads(Path(args.out + ".json").read_text())["rows"]:
            if base(r) not in checked:
                merged.append(r)
            elif base(r) not in placed:
                merged += [n for n in rows if base(n) == base(r)]
                placed.add(base(r))
        rows = merged + [n for n in rows if base(n) not in placed]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1) + "\n")
    Path(args.out + ".md").write_text(markdown(rows))
    print(markdown(rows))
    bad = [r for r in rows if "error" in r or not r["compiled_once"] or r["f64"]["ops"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
