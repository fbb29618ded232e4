"""Request latency: resident Difflet (gRPC -> difflet-runtime) vs diffusers FluxPipeline, same run.

All three run the same flux-tiny components (random:0 checkpoint), prompt, seed, steps, guidance
and size on this machine's CPU:
  difflet        one Generate over a persistent gRPC channel to a `difflet-runtime` subprocess
                 (AOTInductor programs + host schedule; includes PNG encoding and transport)
  eager          FluxPipeline.from_pretrained(ckpt)(...), PIL output
  torch.compile  the same pipeline with `pipe.transformer = torch.compile(pipe.transformer)`
Each: warm-up calls (not timed), then the median of N timed requests. Prints JSON, then a
markdown table with the ratios to eager. Target: difflet <= 0.5x eager.

`--http-against CHECKOUT` instead compares two HTTP fronts side by side: this checkout's
`difflet-runtime --http-port` and the one of another checkout of Difflet (e.g. a `git worktree`
of an older commit), both on the same artifacts, requests alternating between them over a
keep-alive connection (so drift on shared cores hits both alike). Target: this front's median
within 5% of the other's (the FastAPI front vs the stdlib one it replaced, issue 31).

`--img2img STRENGTH` instead serves flux-tiny and flux-tiny-img2img side by side (two servers,
requests alternating) and compares the time per denoising step (the server's denoise time over
its denoiser calls) of an image-to-image request of --steps steps and a text-to-image request of
as many steps as that one makes calls (steps - int(steps - steps x strength), the reference
pipeline's): target equal within noise (5%); the image request's one VAE encode is reported apart
(encode_ms). Writes --out PREFIX.{json,md}.

    python bench/request_latency.py [--n 20] [--warmup 3] [--store DIR] [--steps 4]
    git worktree add /tmp/old f391126 && python bench/request_latency.py --http-against /tmp/old
    python bench/request_latency.py --img2img 0.6 --steps 10 --out bench/results/request_latency_img2img
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


def build_artifacts(store: Path, art: Path, model: str = "flux-tiny"):
    from difflet.codegen.driver import codegen
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    module = optimize(lower_file(str(REPO / "models" / f"{model}.dsl")), parallel="tp1",
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


def bench_http_fronts(art: Path, other: Path, profile: dict, steps: int, n: int, warmup: int) -> dict:
    """{"this": stats, "other": stats}: one image request per round to each server, alternating."""
    import base64
    import http.client
    import os

    from difflet.runtime.demo import launch_server, read_line, stop_server

    body = json.dumps({"prompt": PROMPT, "seed": SEED, "num_inference_steps": steps,
                       "guidance_scale": float(profile["guidance"])})
    servers, conns, samples = {}, {}, {"this": [], "other": []}
    try:
        for name, checkout in (("this", REPO), ("other", other)):
            env = {"PYTHONPATH": str(checkout)}
            state = tempfile.mkdtemp(prefix=f"difflet-bench-{name}-")
            servers[name] = launch_server(art, ("--http-port", "0", "--state-dir", state), env)
            host, port = read_line(servers[name], "http on ").rsplit(":", 1)
            read_line(servers[name], "listening on ")
            conns[name] = http.client.HTTPConnection(host, int(port), timeout=600)

        def call(name: str) -> float:
            start = time.perf_counter()
            conns[name].request("POST", "/v1/images/generations", body, {"Content-Type": "application/json"})
            resp = conns[name].getresponse()
            reply = json.loads(resp.read())
            took = (time.perf_counter() - start) * 1000.0
            assert resp.status == 200 and base64.b64decode(reply["data"][0]["b64_json"]), reply
            return took

        for i in range(warmup + n):
            for name in (("this", "other") if i % 2 == 0 else ("other", "this")):
                took = call(name)
                if i >= warmup:
                    samples[name].append(took)
    finally:
        for conn in conns.values():
            conn.close()
        for proc in servers.values():
            stop_server(proc)
    return {name: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v), "n": n,
                   "warmup": warmup} for name, v in samples.items()}


def bench_img2img(store: Path, tmp: Path, steps: int, strength: float, n: int, warmup: int) -> dict:
    """text-to-image vs image-to-image on two servers, alternating: per-step denoise ms and more."""
    import io

    from PIL import Image

    from difflet.runtime import client
    from difflet.runtime.demo import start_server, stop_server

    buf = io.BytesIO()
    Image.linear_gradient("L").convert("RGB").resize((48, 40)).save(buf, "PNG")
    # the text request runs as many steps as the image request makes calls, so the denoise phase's
    # fixed part (schedule, RoPE tables) is shared by the same number of steps in both
    calls = steps - int(steps - steps * strength)
    fields = {"text-to-image": {"steps": calls}, "image-to-image": {"steps": steps, "image": buf.getvalue(),
                                                                    "strength": strength}}
    servers, samples = {}, {name: [] for name in fields}
    try:
        for name, model in (("text-to-image", "flux-tiny"), ("image-to-image", "flux-tiny-img2img")):
            build_artifacts(store, tmp / model, model)
            servers[name] = start_server(tmp / model)
        for i in range(warmup + n):
            for name in (list(fields) if i % 2 == 0 else list(fields)[::-1]):
                reply = client.generate(servers[name][1], PROMPT, SEED, timeout=600, **fields[name])
                if i >= warmup:
                    samples[name].append((reply.timings.denoise_ms / reply.denoiser_calls, reply.timings.encode_ms,
                                          reply.timings.total_ms, reply.denoiser_calls))
    finally:
        for proc, _ in servers.values():
            stop_server(proc)
    out = {}
    for name, rows in samples.items():
        per_step, encode, total, calls = zip(*rows)
        out[name] = {"per_step_ms": statistics.median(per_step), "per_step_min_ms": min(per_step),
                     "per_step_max_ms": max(per_step), "encode_ms": statistics.median(encode),
                     "total_ms": statistics.median(total), "denoiser_calls": calls[0], "n": n, "warmup": warmup}
    return out


def main_img2img(args, store: Path, tmp: Path) -> int:
    steps = args.steps or 10
    rows = bench_img2img(store, tmp, steps, args.img2img, args.n, args.warmup)
    ratio = rows["image-to-image"]["per_step_ms"] / rows["text-to-image"]["per_step_ms"]
    expected = steps - int(steps - steps * args.img2img)
    report = {"model": "flux-tiny / flux-tiny-img2img", "steps": steps, "strength": args.img2img, "results": rows,
              "per_step_ratio": ratio, "img2img_calls_expected": expected,
              "target": "per-step ratio within [0.95, 1.05]; img2img calls = steps - int(steps - steps x strength)",
              "target_met": 0.95 <= ratio <= 1.05 and rows["image-to-image"]["denoiser_calls"] == expected}
    table = [f"| request (flux-tiny, 32x32; image: {steps} steps at strength {args.img2img}) | denoiser calls "
             "| ms per step (median) | min | max | encode ms | total ms | per-step ratio |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, row in rows.items():
        table.append(f"| {name} | {row['denoiser_calls']} | {row['per_step_ms']:.2f} | {row['per_step_min_ms']:.2f} | "
                     f"{row['per_step_max_ms']:.2f} | {row['encode_ms']:.1f} | {row['total_ms']:.1f} | "
                     f"{row['per_step_ms'] / rows['text-to-image']['per_step_ms']:.3f}x |")
    print(json.dumps(report, indent=2))
    print("\n" + "\n".join(table))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
        args.out.with_suffix(".md").write_text("\n".join(table) + "\n")
    return 0


def main_http(args, module, profile, steps, art: Path) -> int:
    rows = bench_http_fronts(art, args.http_against, profile, steps, args.n, args.warmup)
    ratio = rows["this"]["median_ms"] / rows["other"]["median_ms"]
    report = {"model": module.name, "height": profile["height"], "width": profile["width"],
              "steps": steps, "other_checkout": str(args.http_against), "results": rows,
              "ratio_this_to_other": ratio, "target": "this <= 1.05x other", "target_met": ratio <= 1.05}
    print(json.dumps(report, indent=2))
    print()
    print(f"| HTTP front ({module.name}, {profile['height']}x{profile['width']}, {steps} steps) "
          "| median ms | min ms | max ms | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, row in rows.items():
        print(f"| {name} | {row['median_ms']:.1f} | {row['min_ms']:.1f} | {row['max_ms']:.1f} | "
              f"{row['median_ms'] / rows['other']['median_ms']:.3f}x |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20, help="timed requests per variant")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="default: the profile's")
    parser.add_argument("--store", type=Path, default=None, help="program store (default: the user cache)")
    parser.add_argument("--http-against", type=Path, default=None, metavar="CHECKOUT",
                        help="compare this HTTP front with the one of another Difflet checkout")
    parser.add_argument("--img2img", type=float, default=None, metavar="STRENGTH",
                        help="compare text-to-image and image-to-image steps at this strength")
    parser.add_argument("--out", type=Path, default=None, metavar="PREFIX",
                        help="--img2img: also write PREFIX.json and PREFIX.md")
    args = parser.parse_args(argv)
    if args.img2img is not None and not 0 < args.img2img <= 1:
        parser.error(f"--img2img: {args.img2img} is outside (0, 1]")
    if args.http_against is not None and not (args.http_against / "difflet" / "runtime").is_dir():
        parser.error(f"--http-against: {args.http_against} is not a Difflet checkout")

    import torch

    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.store import default_store_dir

    store = args.store or default_store_dir()
    with tempfile.TemporaryDirectory(prefix="difflet-bench-") as tmp:
        if args.img2img is not None:
            return main_img2img(args, store, Path(tmp))
        module, result = build_artifacts(store, Path(tmp) / "art")
        profile = module.attrs["profile"].to_python()
        steps = args.steps or int(profile["steps"])
        if args.http_against is not None:
            return main_http(args, module, profile, steps, Path(tmp) / "art")
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
