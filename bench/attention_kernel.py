"""Bounded attention as compiled programs run it vs SDPA with the equivalent boolean key mask.

Variants (H heads, S tokens, head dim D, keys valid in [0, S - pad)):
  bounded   difflet.kernels.attention_fused.bounded_attention exported with torch.export and
            compiled with AOTInductor (as codegen does), loaded and called with runtime bounds;
  sdpa      eager F.scaled_dot_product_attention with a [1, 1, 1, S] boolean key mask;
  flex      FlexAttention (torch.nn.attention.flex_attention) with a score_mod that masks keys
            outside [lo, hi) (the bounds stay runtime tensors), compiled the same way: the
            alternative mechanism the fused kernel was chosen against;
  ref       (--with-ref) the torch reference (the oracle) compiled the same way: it builds the
            S x S scores, which is what programs ran before the fused kernel.
Times: all variants loaded in one subprocess and called round-robin, --repeats rounds, median
per variant (on a shared machine, load changes between separate runs would swamp the ratio; the
variant's own subprocess time is kept as alone_ms). Memory: each variant runs in a fresh
subprocess (compilation in yet another one), so peak RSS is that variant's alone: torch + the AOTInductor loader + inputs + the call. Reports median ms over
--repeats calls, peak RSS MB (CPU: VmHWM; CUDA: max_memory_allocated), the call's extra
memory (peak minus the resident size just before the first call), and ratios to sdpa. Prints JSON (also to --json)
and a markdown table. Targets: bounded/sdpa time <= 1.1x, peak RSS <= 1.2x.

  python bench/attention_kernel.py [--heads 8 --seq 4608 --dim 64 --pad 100] [--dtypes fp32,bf16]
                                   [--repeats 5] [--with-ref] [--device cpu|cuda] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def _vm_hwm_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM"))


def _child(args) -> dict:
    """Runs in the subprocess: build inputs, load or define the variant, time it."""
    import statistics
    import time

    import torch
    import torch.nn.functional as F

    dev = torch.device(args.device)
    dtype = getattr(torch, DTYPES[args.dtype])
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, args.heads, args.seq, args.dim, generator=g).to(dev, dtype) for _ in range(3))
    lo = torch.zeros((), dtype=torch.int64, device=dev)
    hi = torch.tensor(args.seq - args.pad, dtype=torch.int64, device=dev)
    from torch._inductor.package import load_package  # every variant loads the same libraries

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def make(variant):
        if variant == "sdpa":
            keep = (torch.arange(args.seq, device=dev) < hi).view(1, 1, 1, -1)
            return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        prog = load_package(args.package.replace("@", variant))
        return lambda: prog(q, k, v, lo, hi)

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if args.variant == "interleaved":  # every variant in this process, round-robin: time only
        calls = {name: make(name) for name in args.variants.split(",")}
        times = {name: [] for name in calls}
        for call in calls.values():
            call()
        for _ in range(args.repeats):
            for name, call in calls.items():
                t0 = time.perf_counter()
                call()
                sync()
                times[name].append((time.perf_counter() - t0) * 1e3)
        return {name: statistics.median(t) for name, t in times.items()}
    call = make(args.variant)
    before = rss_mb() if dev.type == "cpu" else torch.cuda.memory_allocated() / 2**20
    call()
    sync()
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        call()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda"
            else _vm_hwm_mb())  # not ru_maxrss: Linux carries it over fork and exec
    return {"ms": statistics.median(times), "peak_mb": peak, "call_extra_mb": peak - before}


def _compile(args) -> None:
    """Runs in a subprocess: export + AOTInductor-compile the variant to args.package."""
    import torch

    from difflet.codegen.inductor import aoti_package
    from difflet.kernels.attention_fused import bounded_attention as fused
    from difflet.kernels.attention_ref import bounded_attention as ref

    def flex(q, k, v, lo, hi):
        from torch.nn.attention.flex_attention import flex_attention

        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.where((kv_idx >= lo) & (kv_idx < hi), score, -float("inf"))
        return flex_attention(q, k, v, score_mod=score_mod)

    fn = {"bounded": fused, "ref": ref, "flex": flex}[args.variant]

    class Attn(torch.nn.Module):
        def forward(self, q, k, v, lo, hi):
            return fn(q, k, v, lo, hi)

    dev, dtype = torch.device(args.device), getattr(torch, DTYPES[args.dtype])
    # three distinct tensors: export would bake one tensor passed three times in as aliased inputs
    qkv = [torch.randn(1, args.heads, args.seq, args.dim).to(dev, dtype) for _ in range(3)]
    bounds = (torch.tensor(0, device=dev), torch.tensor(args.seq, device=dev))
    ep = torch.export.export(Attn(), (*qkv, *bounds), strict=False)
    aoti_package(ep, Path(args.package.replace("@", args.variant)))


def _run(args, variant: str, dtype: str, tmp: Path, mode: str) -> dict:
    cmd = [sys.executable, __file__, f"--{mode}", "--variant", variant, "--dtypes", dtype,
           "--heads", str(args.heads), "--seq", str(args.seq), "--dim", str(args.dim),
           "--pad", str(args.pad), "--repeats", str(args.repeats), "--device", args.device,
           "--package", str(tmp / f"@-{dtype}.pt2"), "--variants", ",".join(args.variants)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1]) if mode == "child" else {}



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=4608)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--pad", type=int, default=100, help="invalid keys at the end")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--with-ref", action="store_true", help="also the S x S torch reference")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--variants", help=argparse.SUPPRESS)
    ap.add_argument("--package", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child or args.compile:
        args.dtype = args.dtypes
        if args.compile:
            _compile(args)
        else:
            print(json.dumps(_child(args)))
        return 0
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("error: --device cuda: no CUDA device is available on this machine", file=sys.stderr)
            return 2
    variants = ["bounded", "sdpa", "flex"] + (["ref"] if args.with_ref else [])
    args.variants = variants
    result = {"shape": {"heads": args.heads, "seq": args.seq, "dim": args.dim, "valid": args.seq - args.pad},
              "device": args.device, "repeats": args.repeats, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtypes.split(","):
            case = {}
            for variant in variants:
                if variant != "sdpa":
                    _run(args, variant, dtype, Path(tmp), "compile")
                case[variant] = _run(args, variant, dtype, Path(tmp), "child")
                case[variant]["alone_ms"] = case[variant].pop("ms")
            for variant, ms in _run(args, "interleaved", dtype, Path(tmp), "child").items():
                case[variant]["ms"] = ms
            for variant in variants:
                case[variant]["time_ratio"] = case[variant]["ms"] / case["sdpa"]["ms"]
                case[variant]["rss_ratio"] = case[variant]["peak_mb"] / case["sdpa"]["peak_mb"]
                case[variant]["extra_ratio"] = case[variant]["call_extra_mb"] / case["sdpa"]["call_extra_mb"]
            result["cases"][dtype] = case
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    unit = "peak MB" if args.device == "cpu" else "peak alloc MB"
    print(f"\nH={args.heads} S={args.seq} D={args.dim}, keys valid [0, {args.seq - args.pad}), "
          f"{args.device}, median of {args.repeats}\n")
    print(f"| dtype | variant | ms | time / sdpa | {unit} | {unit} / sdpa | call extra MB | extra / sdpa |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|")
    for dtype, case in result["cases"].items():
        for variant, r in case.items():
            print(f"| {dtype} | {variant} | {r['ms']:.0f} | {r['time_ratio']:.2f}x | {r['peak_mb']:.0f} | "
                  f"{r['rss_ratio']:.2f}x | {r['call_extra_mb']:.0f} | {r['extra_ratio']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
