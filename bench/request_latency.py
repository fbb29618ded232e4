"""Request latency: resident Difflet (gRPC -> difflet-runtime) vs diffusers FluxPipeline, same run.

All three run the same flux-tiny components (random:0 checkpoint), prompt, seed, steps, guidance
and size on this machine's CPU:
  difflet        one Generate over a persistent gRPC channel to a `difflet-runtime` subprocess
                 (AOTInductor programs + host schedule; includes PNG encoding and transport)
  eager          FluxPipeline.from_pretrained(ckpt)(...), PIL output
  torch.compile  the same pipeline with `pipe.transformer = torch.compile(pipe.transformer)`
Each: warm-up calls (not timed), then the median of N timed requests. Prints JSON, then a
markdown table with the ratios to eager. Target: difflet <= 0.5x eager.

    python bench/request_latency.py [--n 20] [--warmup 3] [--store DIR] [--steps 4]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROMPT = "a red fox in the snow"
SEED = 42


def timed(fn, n: int, warmup: int) -> dict:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000.0)
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples),
            "n": n, "warmup": warmup}


def build_artifacts(store: Path, art: Path):
    from difflet.codegen.driver import codegen
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    module = optimize(lower_file(str(REPO / "models" / "flux-tiny.dsl")), parallel="tp1",
                      target="cpu", backend="inductor")
    result = codegen(module, "random:0", art, backend="inductor", store=store, log=lambda *a: None)
    return module, result


def bench_difflet(art: Path, profile: dict, steps: int, n: int, warmup: int) -> dict:
    from difflet.runtime import client, difflet_pb2 as pb, difflet_pb2_grpc as pb_grpc
    from difflet.runtime.demo import start_server, stop_server

    proc, address = start_server(art)
    try:
        with client.channel(address) as ch:
            stub = pb_grpc.DiffletStub(ch)
            request = pb.GenerateRequest(prompt=PROMPT, seed=SEED, steps=steps,
                                         guidance=float(profile["guidance"]))
            last = {}

            def call():
                last["reply"] = stub.Generate(request, timeout=600)

            stats = timed(call, n, warmup)
            t = last["reply"].timings
            stats["server_ms"] = {"encode": t.encode_ms, "denoise": t.denoise_ms,
                                  "decode": t.decode_ms, "total": t.total_ms}
    finally:
        stop_server(proc)
    return stats


def bench_pipeline(ckpt: Path, profile: dict, steps: int, n: int, warmup: int, compile_: bool) -> dict:
    import torch
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(str(ckpt))
    pipe.set_progress_bar_config(disable=True)
    if compile_:
        pipe.transformer = torch.compile(pipe.transformer)

    def call():
        with torch.inference_mode():
            pipe(PROMPT, generator=torch.Generator("cpu").manual_seed(SEED), num_inference_steps=steps,
                 guidance_scale=float(profile["guidance"]), height=int(profile["height"]),
                 width=int(profile["width"]), max_sequence_length=int(profile["max_text"]))

    return timed(call, n, warmup)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="timed requests per variant")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="default: the profile's")
    parser.add_argument("--store", type=Path, default=None, help="program store (default: the user cache)")
    args = parser.parse_args(argv)

    import torch

    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.store import default_store_dir

    store = args.store or default_store_dir()
    with tempfile.TemporaryDirectory(prefix="difflet-bench-") as tmp:
        module, result = build_artifacts(store, Path(tmp) / "art")
        profile = module.attrs["profile"].to_python()
        steps = args.steps or int(profile["steps"])
        ckpt = resolve_weights(module, "random:0", store)
        rows = {
            "difflet": bench_difflet(Path(tmp) / "art", profile, steps, args.n, args.warmup),
            "eager": bench_pipeline(ckpt, profile, steps, args.n, args.warmup, compile_=False),
            "torch.compile": bench_pipeline(ckpt, profile, steps, args.n, args.warmup, compile_=True),
        }
    eager = rows["eager"]["median_ms"]
    for row in rows.values():
        row["ratio_to_eager"] = row["median_ms"] / eager
    report = {"model": module.name, "height": profile["height"], "width": profile["width"],
              "steps": steps, "threads": torch.get_num_threads(), "codegen_compiled": len(result.compiled),
              "results": rows, "target": "difflet <= 0.5x eager",
              "target_met": rows["difflet"]["ratio_to_eager"] <= 0.5}
    print(json.dumps(report, indent=2))
    print()
    print(f"| variant ({module.name}, {profile['height']}x{profile['width']}, {steps} steps) "
          "| median ms | min ms | ratio to eager |")
    print("|---|---:|---:|---:|")
    for name, row in rows.items():
        print(f"| {name} | {row['median_ms']:.1f} | {row['min_ms']:.1f} | {row['ratio_to_eager']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
