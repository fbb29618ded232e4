"""One denoiser call at real width: diffusers eager vs diffusers + torch.compile vs Difflet's program.

Cases (bench/denoiser_cases.py): FLUX at 512 and 1024 (bf16, fp32) and a HunyuanVideo-shaped
masked case (10,240 visual tokens, 24 of 256 text keys valid), each module at real width with
1 double + 1 single block and random weights. Per case and variant, in a fresh subprocess (so peak
RSS is that variant's alone):
  eager     the diffusers module, called as its pipeline calls it;
  compile   the same module under torch.compile (inductor, default mode; compile time excluded);
  difflet   the program codegen builds: Difflet's attention installed, torch.export +
            AOTInductor (weights outside the .so), loaded by the runtime's loader (CompiledRunner).
Reports median ms of --repeats calls after one warm-up, peak RSS MB (the process's, loading
included; and call_peak_mb, the peak while calling: the high-water mark reset before the
first call, resident weights included), ratios difflet/eager and
difflet/compile, and achieved TFLOPS (torch.utils.flop_counter on the eager call) next to this
machine's measured TFLOPS for a plain linear of the same width and dtype (the practical limit).
--host-overhead adds, for the bundled flux-shapes model and the first FLUX case of --cases (the
real-width transformer with flux-tiny's encoders and VAE widened to it), requests served through
the Python API (DiffletPipeline, the runtime's host loop) in a process that loads the programs an
earlier one compiled, as a server does: a denoising step's wall time minus its
program call, median over the steps of --repeats requests of --steps steps (target <= 0.5 ms).
Prints JSON (one object: case -> {eager_ms, compile_ms, difflet_ms, eager_peak_mb,
compile_peak_mb, difflet_peak_mb, tflop, host_overhead_ms, ...}, also to --json) and a markdown table.

  python bench/denoiser_real.py [--cases flux512-bf16,...,hunyuan10k-bf16] [--repeats 3] [--quick]
                                [--host-overhead] [--device cpu|cuda] [--json FILE]
--quick: flux512-bf16 only, 2 repeats. The 1024 fp32 case takes ~20 s per call on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from denoiser_cases import CASES, DTYPES, REPO, checkpoint, dsl, eager_inputs, program_values  # noqa: E402

VARIANTS = ("eager", "compile", "difflet")


def _vm_hwm_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM"))


def _timed(call, repeats: int, dev) -> dict:
    import statistics
    import time

    import torch

    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    else:
        with open("/proc/self/clear_refs", "w") as f:  # the high-water mark restarts at the current RSS
            f.write("5")
    with torch.inference_mode():
        t0 = time.perf_counter()
        call()  # warm-up (and torch.compile's compilation)
        sync()
        first = (time.perf_counter() - t0) * 1e3
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            call()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
    return {"first_ms": first, "ms": statistics.median(times),
            "call_peak_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else _vm_hwm_mb()}


def _flops(call, dtype: str, dev, sync) -> dict:
    """FLOPs of one call, and this machine's TFLOPS for a plain linear at FLUX width."""
    import statistics
    import time

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.inference_mode(), FlopCounterMode(display=False) as fc:
        call()
    dt = getattr(torch, DTYPES[dtype])
    x, w = torch.randn(4096, 3072, dtype=dt, device=dev), torch.randn(3072, 3072, dtype=dt, device=dev)
    torch.nn.functional.linear(x, w)
    lt = []
    for _ in range(5):
        t0 = time.perf_counter()
        torch.nn.functional.linear(x, w)
        sync()
        lt.append(time.perf_counter() - t0)
    return {"tflop": fc.get_total_flops() / 1e12, "linear_tflops": 2 * 4096 * 3072 * 3072 / statistics.median(lt) / 1e12}


def _child(args) -> dict:
    """In a fresh process: build the variant, time it, report peak memory (and FLOPs for eager)."""
    import torch

    case = CASES[args.case]
    dev = torch.device(args.device)
    kw = eager_inputs(case, dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if args.variant in ("eager", "compile"):
        import diffusers
        model = getattr(diffusers, case.class_name).from_pretrained(
            args.ckpt, subfolder="transformer", torch_dtype=getattr(torch, DTYPES[case.dtype])).to(dev).eval()
        fn = torch.compile(model) if args.variant == "compile" else model
        call = lambda: fn(**kw, return_dict=False)[0]  # noqa: E731
    else:
        from difflet.codegen.inductor import PROGRAM_FILE, CompiledRunner
        from difflet.frontend.lower import lower_text
        from difflet.passes.pipeline import optimize
        from difflet.runtime.invoke import bind_inputs

        module = optimize(lower_text(dsl(case), f"{args.case}.dsl"), parallel="tp1", target=args.device,
                          backend="inductor")
        node = module.component("transformer")
        entry = Path(args.work) / f"{args.case}-program"
        if args.repeats == 0:  # the parent's compile-only run: program + weights file, as codegen writes
            from safetensors.torch import save_file

            from difflet.codegen.build import build_program_module
            from difflet.codegen.inductor import compile_entry, program_weights

            pm = build_program_module(node, args.ckpt)
            entry.mkdir(parents=True, exist_ok=True)
            compile_entry(node, pm, entry)
            save_file(program_weights(pm, entry), str(entry / "weights.safetensors"))
            return {}
        prog = CompiledRunner(entry / PROGRAM_FILE, entry / "weights.safetensors")
        program_args = [a.to(dev) for a in bind_inputs(node, program_values(case, kw))]
        call = lambda: prog(*program_args)  # noqa: E731
    out = _timed(call, args.repeats, dev)
    if args.variant == "eager":
        out.update(_flops(call, case.dtype, dev, sync))
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork and exec from the parent
    out["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda" else _vm_hwm_mb()
    return out


def _host(args) -> dict:
    """In a fresh process: requests served through DiffletPipeline (the runtime's host loop); per
    denoising step after a request's first, the wall time between two step callbacks minus the
    program call inside it; the median over every such step of --repeats requests (robust to the
    odd step the OS or a page fault stretches by milliseconds)."""
    import statistics
    import time

    from difflet.pipeline import DiffletPipeline

    if args.case == "flux-shapes":
        weights, model = REPO / "difflet" / "assets" / "flux-shapes", "flux-shapes"
    else:  # the case's real-width denoiser with flux-tiny's tiny encoders and VAE, random weights
        weights, model = "random:0", Path(args.work) / f"{args.case}.dsl"
        model.write_text(dsl(CASES[args.case]))
    with DiffletPipeline.from_pretrained(weights, model=model, store=Path(args.work) / "store") as pipe:
        if args.repeats == 0:  # the compile-only run: a server loads programs, it never compiles them
            return {}
        env = pipe.runner.env
        (name,) = [c.name for c in env.module.components("denoiser")]
        program, calls, ends = env.programs[name], [], []

        def timed(*a):
            t0 = time.perf_counter()
            out = program(*a)
            calls.append((time.perf_counter() - t0) * 1e3)
            return out

        env.programs[name] = timed
        pipe("a red circle", num_inference_steps=2, seed=0)  # warm-up
        steps, over = [], []
        for seed in range(args.repeats):
            calls.clear(), ends.clear()
            pipe("a red circle", num_inference_steps=args.steps, seed=seed,
                 callback=lambda *_: ends.append(time.perf_counter() * 1e3))
            for i in range(1, len(ends)):
                steps.append(ends[i] - ends[i - 1])
                over.append(steps[-1] - calls[i])
    return {"host_step_ms": statistics.median(steps), "host_program_ms": statistics.median(calls),
            "host_overhead_ms": statistics.median(over), "host_overhead_max_ms": max(over),
            "host_steps": args.steps}


def _run_child(args, env, **extra) -> dict:
    cmd = [sys.executable, __file__, "--child", "--device", args.device, "--repeats", str(args.repeats),
           "--steps", str(args.steps)] + [x for k, v in extra.items() for x in (f"--{k}", str(v))]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd[2:])} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {}


def _measure(args, case: str, work: str, env) -> dict:
    row = {"tokens": CASES[case].tokens} if case in CASES else {}
    compile_only = argparse.Namespace(**{**vars(args), "repeats": 0})  # its memory is not the calls'
    if case in CASES and args.variants:
        ckpt = Path(work) / f"ckpt-{CASES[case].family}-{CASES[case].dtype}"
        if not ckpt.exists():
            checkpoint(CASES[case], ckpt)
        for variant in args.variants.split(","):
            common = dict(case=case, variant=variant, ckpt=ckpt, work=work)
            if variant == "difflet":  # compile in its own process first
                _run_child(compile_only, env, **common)
            r = _run_child(args, env, **common)
            row[f"{variant}_ms"], row[f"{variant}_peak_mb"] = r["ms"], r["peak_mb"]
            row[f"{variant}_call_peak_mb"] = r["call_peak_mb"]
            row.update({k: r[k] for k in ("tflop", "linear_tflops") if k in r})
    if case in args.host_cases:
        _run_child(compile_only, env, case=case, variant="host", work=work)  # a server never compiles
        row.update(_run_child(args, env, case=case, variant="host", work=work))
    if "difflet_ms" in row:
        for base in ("eager", "compile"):
            if f"{base}_ms" in row:
                row[f"difflet_vs_{base}"] = row["difflet_ms"] / row[f"{base}_ms"]
        if "eager_peak_mb" in row:
            row["difflet_peak_vs_eager"] = row["difflet_peak_mb"] / row["eager_peak_mb"]
            row["difflet_call_peak_vs_eager"] = row["difflet_call_peak_mb"] / row["eager_call_peak_mb"]
    if "tflop" in row:
        for v in args.variants.split(","):
            row[f"{v}_tflops"] = row["tflop"] / (row[f"{v}_ms"] / 1e3)
    return row


def _table(result: dict, args) -> str:
    f = lambda row, k, p=0: f"{row[k]:,.{p}f}" if k in row else "-"  # noqa: E731
    lines = [f"{args.device}, median of {args.repeats} calls, 1 double + 1 single block at real width", "",
             "| case | tokens | eager ms | compile ms | difflet ms | difflet / eager | difflet / compile | "
             "peak MB eager / difflet | TFLOP | TFLOPS eager / difflet | linear TFLOPS | host overhead ms/step |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for case, r in result.items():
        lines.append(f"| {case} | {r.get('tokens', '-')} | {f(r, 'eager_ms')} | {f(r, 'compile_ms')} | "
                     f"{f(r, 'difflet_ms')} | {f(r, 'difflet_vs_eager', 2)} | {f(r, 'difflet_vs_compile', 2)} | "
                     f"{f(r, 'eager_peak_mb')} / {f(r, 'difflet_peak_mb')} | {f(r, 'tflop', 2)} | "
                     f"{f(r, 'eager_tflops', 3)} / {f(r, 'difflet_tflops', 3)} | {f(r, 'linear_tflops', 3)} | "
                     f"{f(r, 'host_overhead_ms', 3)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="flux512-bf16 only, 2 repeats")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="'' with --host-overhead: host only")
    ap.add_argument("--host-overhead", action="store_true", help="also flux-shapes and one FLUX case served")
    ap.add_argument("--steps", type=int, default=8, help="denoising steps per --host-overhead request")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    for hidden in ("--child", "--case", "--variant", "--ckpt", "--work"):
        ap.add_argument(hidden, action="store_true" if hidden == "--child" else None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_host(args) if args.variant == "host" else _child(args)))
        return 0
    if args.quick:
        args.cases, args.repeats = "flux512-bf16", 2
    cases = args.cases.split(",")
    bad = [c for c in cases if c not in CASES]
    bad_variants = [v for v in filter(None, args.variants.split(",")) if v not in VARIANTS]
    if bad or bad_variants:
        print(f"error: --cases/--variants: unknown {bad + bad_variants}; expected cases {sorted(CASES)}, "
              f"variants {list(VARIANTS)}", file=sys.stderr)
        return 2
    flux = [c for c in cases if CASES[c].family == "flux"]
    args.host_cases = (["flux-shapes"] + flux[:1]) if args.host_overhead else []
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("error: --device cuda: no CUDA device is available on this machine", file=sys.stderr)
            return 2
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = {}
    with tempfile.TemporaryDirectory() as work:
        for case in (["flux-shapes"] if args.host_overhead else []) + cases:
            result[case] = _measure(args, case, work, env)
            print(json.dumps({case: result[case]}), flush=True)
    print(json.dumps(result, indent=1))
    table = _table(result, args)
    print("\n" + table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.md:
        args.md.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
