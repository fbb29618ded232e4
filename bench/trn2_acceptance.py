"""The Python steps of bench/trn2_acceptance.sh (run that script; this file is its helper).

    preflight --checkpoint DIR      the checkpoint is a diffusers FLUX directory (no SDK call)
    sdk --json FILE                 the Neuron SDK and a Trainium device are present, else one line, exit 2
    compare --neuron ART --reference ART --json FILE [--timed N]
                                    every program of the neuron ART against the inductor ART's program of
                                    the same name on the same inputs (max abs, cosine), and the denoiser's
                                    step time (median of N calls after the first)
    serve --artifacts ART --json FILE [--prompt P --seed S --steps N --requests R --cooldown C --image F]
                                    difflet-runtime on ART: load time (start -> SERVING), then one warm-up
                                    and R timed requests over gRPC (the median is the request time)
    timed --json FILE -- CMD...     run CMD, write its wall time and exit status (the last stderr line when
                                    it fails, e.g. a layout codegen refuses); exit with CMD's status
    report --dir OUT                every layout's JSON -> OUT/trn2_acceptance.{json,md}, expectations beside;
                                    exit 1 when a compared program is below MIN_COSINE or missing

Invariants: `preflight` and `sdk` import nothing of the SDK (find_spec and the file system only), so a
host without it stops there with one line; every figure in the report comes from a file a step wrote.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SDK_RELEASE = "2.29"  # README "Trainium": the release every neuron call site is written against
# module -> what provides it (nkilib ships inside neuronx-cc since Neuron 2.27: release notes 2.27.0 nki-lib.rst)
SDK_MODULES = {"torch_neuronx": "torch-neuronx", "neuronx_distributed": "neuronx-distributed",
               "nkilib": "neuronx-cc (bundled NKI Library)"}
# The paper's figures for FLUX.1-dev on trn2.3xlarge (paper.txt Tables 3 and 5, Section 7.2)
EXPECTED = {
    "tp4": {"compile_s": 16.7 * 60, "load_s": 23.0, "step_ms": 270.0, "request_s": 14.2},
    "tp2cp2": {"step_ms": 263.3},  # Table 5, Ulysses
}
MIN_COSINE = 0.999  # bf16 programs of one model on two backends: a wrong program lands far below


def fail(msg: str) -> None:
    print(f"trn2_acceptance: {msg}", file=sys.stderr)
    raise SystemExit(2)


def cmd_preflight(a) -> None:
    index = Path(a.checkpoint) / "model_index.json"
    if not index.is_file():
        fail(f"--checkpoint {a.checkpoint}: no model_index.json there; give a diffusers-format FLUX.1-dev "
             "directory (the checkpoint's own files, not a hub name)")
    try:
        cls = json.loads(index.read_text()).get("_class_name")
    except (OSError, ValueError) as e:
        fail(f"{index}: not readable JSON ({e.__class__.__name__})")
    if cls != "FluxPipeline":
        fail(f"{index}: _class_name is {cls!r}, not 'FluxPipeline'; this script runs FLUX.1-dev")


def cmd_sdk(a) -> None:
    missing = [f"{mod} ({pkg})" for mod, pkg in SDK_MODULES.items() if importlib.util.find_spec(mod) is None]
    if shutil.which("neuronx-cc") is None:
        missing.append("neuronx-cc (the compiler, not on PATH)")
    devices = sorted(glob.glob("/dev/neuron[0-9]*"))
    if not devices:
        missing.append("/dev/neuron* (no Trainium device on this host)")
    if missing:
        fail(f"stopped before the first Neuron SDK call: missing {', '.join(missing)}; install the AWS "
             f"Neuron SDK {SDK_RELEASE} on a trn2 host")
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for pkg in ("torch-neuronx", "neuronx-cc", "neuronx-distributed", "torch"):
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    Path(a.json).write_text(json.dumps({"sdk_release": SDK_RELEASE, "versions": versions,
                                        "devices": devices}, indent=2))


def _closeness(got, want) -> dict:
    import torch

    g, w = got.detach().double().flatten(), want.detach().double().flatten()
    cos = torch.nn.functional.cosine_similarity(g, w, dim=0).item()
    return {"shape": list(got.shape), "max_abs": (g - w).abs().max().item(), "cosine": cos,
            "max_abs_reference": w.abs().max().item()}


def cmd_compare(a) -> None:
    from difflet.codegen.artifacts import load_artifacts
    from difflet.codegen.build import example_inputs

    ours, ref = load_artifacts(Path(a.neuron)), load_artifacts(Path(a.reference))
    denoisers = {c.name for c in ours.module.components("denoiser")}
    out = {"programs": {}, "min_cosine": MIN_COSINE}
    try:
        for name, prog in ours.programs.items():
            if name not in ref.programs:
                out["programs"][name] = {"error": "no program of this name in the reference ART"}
                continue
            x = example_inputs(prog.node)  # seeded: the same tensors for both programs
            got, want = prog(*x), ref.programs[name](*x)
            outputs = [_closeness(g, w) for g, w in zip(got, want, strict=True)]
            row = {"outputs": outputs, "ok": all(o["cosine"] >= MIN_COSINE for o in outputs)}
            if name in denoisers:
                times = []
                for _ in range(a.timed):
                    start = time.perf_counter()
                    prog(*x)
                    times.append((time.perf_counter() - start) * 1000.0)
                row["step_ms"] = statistics.median(times) if times else None
                out["step_ms"] = row["step_ms"]
            out["programs"][name] = row
            print(f"{name}: " + "; ".join(f"max abs {o['max_abs']:.3e}, cos {o['cosine']:.6f}" for o in outputs)
                  + (f"; step {row['step_ms']:.1f} ms" if row.get("step_ms") else ""), flush=True)
    finally:
        for art in (ours, ref):
            for prog in art.programs.values():
                getattr(prog, "close", lambda: None)()
    Path(a.json).write_text(json.dumps(out, indent=2))


def cmd_serve(a) -> None:
    from difflet.runtime import client
    from difflet.runtime.demo import start_server, stop_server

    start = time.perf_counter()
    proc, address = start_server(Path(a.artifacts), timeout=a.load_timeout)
    load_s = time.perf_counter() - start
    print(f"serving on {address} after {load_s:.1f} s", flush=True)
    try:
        fields = {"steps": a.steps, "height": a.size, "width": a.size}
        warm = client.generate(address, a.prompt, a.seed, timeout=a.request_timeout, **fields)
        Path(a.image).write_bytes(warm.png)
        if a.cooldown:
            print(f"idle {a.cooldown} s before the timed requests (the device slows under back-to-back load)",
                  flush=True)
            time.sleep(a.cooldown)
        requests = []
        for _ in range(a.requests):
            t0 = time.perf_counter()
            reply = client.generate(address, a.prompt, a.seed, timeout=a.request_timeout, **fields)
            requests.append({"request_s": time.perf_counter() - t0, "denoise_ms": reply.timings.denoise_ms,
                             "denoiser_calls": reply.denoiser_calls, "total_ms": reply.timings.total_ms,
                             "identical_to_warmup": reply.png == warm.png})
    finally:
        stop_server(proc)
    median = statistics.median(r["request_s"] for r in requests) if requests else None
    Path(a.json).write_text(json.dumps({"load_s": load_s, "request_s": median, "requests": requests,
                                        "prompt": a.prompt, "seed": a.seed, "steps": a.steps,
                                        "size": a.size, "image": a.image}, indent=2))


def cmd_timed(a) -> None:
    import subprocess

    start = time.perf_counter()
    proc = subprocess.run(a.command, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(proc.stderr)
    row = {"command": a.command, "seconds": time.perf_counter() - start, "rc": proc.returncode}
    if proc.returncode:
        last = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        row["refused"] = last[-1] if last else f"exit {proc.returncode}"
    Path(a.json).write_text(json.dumps(row, indent=2))
    raise SystemExit(proc.returncode)


def _fmt(value, unit: str) -> str:
    return "—" if value is None else f"{value:.1f} {unit}"


def cmd_report(a) -> None:
    root = Path(a.dir)
    layouts = {}
    for layout in a.layouts:
        row = {}
        for part in ("compile", "compare", "serve"):
            f = root / f"{part}-{layout}.json"
            row[part] = json.loads(f.read_text()) if f.is_file() else None
        layouts[layout] = row
    sdk = root / "sdk.json"
    result = {"sdk": json.loads(sdk.read_text()) if sdk.is_file() else None, "expected": EXPECTED,
              "layouts": layouts}
    (root / "trn2_acceptance.json").write_text(json.dumps(result, indent=2))
    lines = ["| layout | compile | load | step | request | programs vs inductor (worst cos) |",
             "|---|---:|---:|---:|---:|---|"]
    for layout, row in layouts.items():
        exp = EXPECTED.get(layout, {})
        comp, cmpr, serve = row["compile"] or {}, row["compare"] or {}, row["serve"] or {}
        if comp.get("refused"):
            lines.append(f"| {layout} | refused: {comp['refused']} | | | | |")
            continue
        worst = min((o["cosine"] for p in cmpr.get("programs", {}).values() for o in p.get("outputs", [])),
                    default=None)

        def cell(value, key, unit, scale=1.0):
            got = _fmt(None if value is None else value * scale, unit)
            return got + (f" (paper {_fmt(exp[key] * scale, unit)})" if key in exp else "")

        lines.append(f"| {layout} | {cell(comp.get('seconds'), 'compile_s', 'min', 1 / 60)} "
                     f"| {cell(serve.get('load_s'), 'load_s', 's')} | {cell(cmpr.get('step_ms'), 'step_ms', 'ms')} "
                     f"| {cell(serve.get('request_s'), 'request_s', 's')} "
                     f"| {'—' if worst is None else f'{worst:.6f} (need >= {MIN_COSINE})'} |")
    (root / "trn2_acceptance.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    disagree = [f"{layout}/{name}" for layout, row in layouts.items()
                for name, p in ((row["compare"] or {}).get("programs") or {}).items() if not p.get("ok")]
    if disagree:
        print(f"trn2_acceptance: below cosine {MIN_COSINE} or not compared: {', '.join(disagree)}", file=sys.stderr)
        raise SystemExit(1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="trn2_acceptance.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("preflight")
    s.add_argument("--checkpoint", required=True)
    s = sub.add_parser("sdk")
    s.add_argument("--json", required=True)
    s = sub.add_parser("compare")
    s.add_argument("--neuron", required=True)
    s.add_argument("--reference", required=True)
    s.add_argument("--json", required=True)
    s.add_argument("--timed", type=int, default=10)
    s = sub.add_parser("serve")
    s.add_argument("--artifacts", required=True)
    s.add_argument("--json", required=True)
    s.add_argument("--image", required=True)
    s.add_argument("--prompt", required=True)
    s.add_argument("--seed", type=int, default=42)
    s.add_argument("--steps", type=int, default=28)
    s.add_argument("--size", type=int, default=1024)
    s.add_argument("--requests", type=int, default=5)
    s.add_argument("--cooldown", type=float, default=90.0)
    s.add_argument("--load-timeout", type=float, default=3600.0)
    s.add_argument("--request-timeout", type=float, default=600.0)
    s = sub.add_parser("timed")
    s.add_argument("--json", required=True)
    s.add_argument("command", nargs="+")
    s = sub.add_parser("report")
    s.add_argument("--dir", required=True)
    s.add_argument("--layouts", nargs="+", required=True)
    a = p.parse_args(argv)
    {"preflight": cmd_preflight, "sdk": cmd_sdk, "compare": cmd_compare, "serve": cmd_serve,
     "timed": cmd_timed, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    main()
