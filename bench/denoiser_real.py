"""One denoiser call at real width: diffusers eager vs diffusers + torch.compile vs Difflet's program.

The model is FluxTransformer2DModel at FLUX.1-dev width (24 heads x 128 = 3072 hidden, joint dim
4096, pooled 768, RoPE axes (16, 56, 56), 64 latent channels) with 1 double + 1 single block and
random weights (seeded, saved once per dtype as a checkpoint, so every variant runs the same
weights). Cases: flux512 (1,024 visual + 512 text tokens), flux1024 (4,096 + 512), each in bf16
and fp32. Per case and variant, in a fresh subprocess (so peak RSS is that variant's alone):
  eager     the diffusers module, called as FluxPipeline calls it;
  compile   the same module under torch.compile (inductor, default mode; compile time excluded);
  difflet   the program codegen builds: Difflet's attention installed, torch.export +
            AOTInductor (weights outside the .so), loaded and fed its constants as the runtime does.
Reports median ms of --repeats calls after one warm-up, peak RSS MB, ratios difflet/eager and
difflet/compile, and achieved TFLOPS (torch.utils.flop_counter on the eager call) next to this
machine's measured TFLOPS for a plain linear of the same width and dtype (the practical limit).
Prints JSON (one object: case -> {eager_ms, compile_ms, difflet_ms, eager_peak_mb,
compile_peak_mb, difflet_peak_mb, tflop, ...}, also to --json) and a markdown table.

  python bench/denoiser_real.py [--cases flux512-bf16,flux1024-bf16,...] [--repeats 3] [--quick]
                                [--device cpu|cuda] [--json FILE]
--quick: flux512-bf16 only, 2 repeats. The 1024 fp32 case takes minutes per call on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = dict(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=128,
              num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
              guidance_embeds=True, axes_dims_rope=[16, 56, 56])
TEXT = 512
CASES = {f"flux{px}-{dt}": (px, dt) for px in (512, 1024) for dt in ("bf16", "fp32")}
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
VARIANTS = ("eager", "compile", "difflet")

DENOISER = """denoiser transformer = diffusers.FluxTransformer2DModel from "transformer" {{
    config {{ {config} }}
    dtype dtype
    input hidden_states:         dtype[1, {v}, 64]
    input encoder_hidden_states: dtype[1, {text}, 4096]
    input pooled_projections:    dtype[1, 768]
    input timestep:              dtype[1]
    input img_ids:               dtype[{v}, 3]
    input txt_ids:               dtype[{text}, 3]
    input guidance:              float32[1]
    input valid_text: runtime valid_text
    output sample: dtype[1, {v}, 64] select 0
    attention "transformer_blocks.*.attn": joint
        heads 24 head_dim 128 order (text, visual) text_mask false valid valid_text
    attention "single_transformer_blocks.*.attn": joint
        heads 24 head_dim 128 order (text, visual) text_mask false valid valid_text
}}

"""


def _dsl(px: int, dtype: str) -> str:
    """models/flux-tiny.dsl (its tiny encoders and VAE are never built here) with the denoiser
    replaced by the real-width one and the text length and dtype of the case."""
    cfg = ", ".join(f"{k}: {json.dumps(v)}" for k, v in CONFIG.items())
    text = (REPO / "models" / "flux-tiny.dsl").read_text()
    a, b = text.index("denoiser transformer"), text.index("decoder vae")
    text = text[:a] + DENOISER.format(config=cfg, v=(px // 16) ** 2, text=TEXT) + text[b:]
    side = px // 16 * 8  # the tiny VAE's profile size with the case's visual token count
    for old, new in (("max_text = 32", f"max_text = {TEXT}"), ("dtype    = float32", f"dtype    = {DTYPES[dtype]}"),
                     ("height   = 32", f"height   = {side}"), ("width    = 32", f"width    = {side}")):
        text = text.replace(old, new)
    return text


def _inputs(px, dtype, dev):
    import torch

    g = torch.Generator().manual_seed(1)
    v, dt = (px // 16) ** 2, getattr(torch, DTYPES[dtype])
    side = px // 16
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(side * 1.0), torch.arange(side * 1.0),
                                         indexing="ij"), -1).reshape(v, 3)
    return dict(hidden_states=torch.randn(1, v, 64, generator=g).to(dev, dt),
                encoder_hidden_states=torch.randn(1, TEXT, 4096, generator=g).to(dev, dt),
                pooled_projections=torch.randn(1, 768, generator=g).to(dev, dt),
                timestep=torch.tensor([0.5]).to(dev, dt), img_ids=img_ids.to(dev, dt),
                txt_ids=torch.zeros(TEXT, 3).to(dev, dt), guidance=torch.tensor([3.5], device=dev))


def _child(args) -> dict:
    """In a fresh process: build the variant, time it, report peak memory (and FLOPs for eager)."""
    import resource
    import statistics
    import time

    import torch

    px, dtype = CASES[args.case]
    dev = torch.device(args.device)
    kw = _inputs(px, dtype, dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    out = {}
    if args.variant in ("eager", "compile"):
        from diffusers import FluxTransformer2DModel
        model = FluxTransformer2DModel.from_pretrained(args.ckpt, subfolder="transformer",
                                                       torch_dtype=getattr(torch, DTYPES[dtype])).to(dev).eval()
        fn = torch.compile(model) if args.variant == "compile" else model
        call = lambda: fn(**kw, return_dict=False)[0]  # noqa: E731
    else:
        from torch._inductor.package import load_package

        from difflet.codegen.build import build_program_module
        from difflet.codegen.inductor import FQNS_FILE, PROGRAM_FILE, compile_entry, program_weights
        from difflet.frontend.lower import lower_text
        from difflet.passes.pipeline import optimize

        module = optimize(lower_text(_dsl(px, dtype), "denoiser_real.dsl"), parallel="tp1",
                          target=args.device, backend="inductor")
        node = module.component("transformer")
        pm = build_program_module(node, args.ckpt)
        entry = Path(args.work) / f"{args.case}-program"
        if not (entry / FQNS_FILE).exists():  # the parent's compile-only run (--repeats 0) builds it
            entry.mkdir(parents=True, exist_ok=True)
            compile_entry(node, pm, entry)
        if args.repeats == 0:
            return {}
        prog = load_package(str(entry / PROGRAM_FILE))
        prog.load_constants(program_weights(pm, entry), check_full_update=True)
        del pm
        args_ = [kw[k] for k in ("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep",
                                 "img_ids", "txt_ids", "guidance")] + [torch.tensor(TEXT)]
        call = lambda: prog(*args_)  # noqa: E731
    with torch.inference_mode():
        t0 = time.perf_counter()
        call()  # warm-up (and torch.compile's compilation)
        sync()
        out["first_ms"] = (time.perf_counter() - t0) * 1e3
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            call()
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        out["ms"] = statistics.median(times)
        if args.variant == "eager":
            from torch.utils.flop_counter import FlopCounterMode
            with FlopCounterMode(display=False) as fc:
                call()
            out["tflop"] = fc.get_total_flops() / 1e12
            dt = getattr(torch, DTYPES[dtype])
            x, w = torch.randn(4096, 3072, dtype=dt, device=dev), torch.randn(3072, 3072, dtype=dt, device=dev)
            torch.nn.functional.linear(x, w)
            lt = []
            for _ in range(5):
                t0 = time.perf_counter()
                torch.nn.functional.linear(x, w)
                sync()
                lt.append(time.perf_counter() - t0)
            out["linear_tflops"] = 2 * 4096 * 3072 * 3072 / statistics.median(lt) / 1e12
    out["peak_mb"] = (torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda"
                      else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def _checkpoint(dtype: str, dest: Path) -> None:
    import torch
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    FluxTransformer2DModel(**CONFIG).to(getattr(torch, DTYPES[dtype])).save_pretrained(str(dest / "transformer"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="flux512-bf16,flux512-fp32,flux1024-bf16,flux1024-fp32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="flux512-bf16 only, 2 repeats")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args)))
        return 0
    if args.quick:
        args.cases, args.repeats = "flux512-bf16", 2
    cases = args.cases.split(",")
    bad = [c for c in cases if c not in CASES]
    if bad:
        print(f"error: --cases: unknown {bad}; expected some of {sorted(CASES)}", file=sys.stderr)
        return 2
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("error: --device cuda: no CUDA device is available on this machine", file=sys.stderr)
            return 2
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = {}
    with tempfile.TemporaryDirectory() as work:
        for case in cases:
            px, dtype = CASES[case]
            ckpt = Path(work) / f"ckpt-{dtype}"
            if not ckpt.exists():
                _checkpoint(dtype, ckpt)
            row = {}
            for variant in args.variants.split(","):
                cmd = [sys.executable, __file__, "--child", "--case", case, "--variant", variant, "--ckpt",
                       str(ckpt), "--work", work, "--repeats", str(args.repeats), "--device", args.device]
                if variant == "difflet":  # compile in its own process first: its memory is not the call's
                    subprocess.run(cmd[:2] + ["--child", "--case", case, "--variant", variant, "--ckpt", str(ckpt),
                                              "--work", work, "--repeats", "0", "--device", args.device],
                                   check=True, capture_output=True, text=True, env=env)
                r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                              env=env).stdout.strip().splitlines()[-1])
                row[f"{variant}_ms"], row[f"{variant}_peak_mb"] = r["ms"], r["peak_mb"]
                row.update({k: r[k] for k in ("tflop", "linear_tflops") if k in r})
            if "difflet_ms" in row:
                for base in ("eager", "compile"):
                    if f"{base}_ms" in row:
                        row[f"difflet_vs_{base}"] = row["difflet_ms"] / row[f"{base}_ms"]
                if "eager_peak_mb" in row:
                    row["difflet_peak_vs_eager"] = row["difflet_peak_mb"] / row["eager_peak_mb"]
            if "tflop" in row:
                for v in args.variants.split(","):
                    row[f"{v}_tflops"] = row["tflop"] / (row[f"{v}_ms"] / 1e3)
            result[case] = row
            print(json.dumps({case: row}), flush=True)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{args.device}, median of {args.repeats} calls, 1 double + 1 single block at FLUX width\n")
    print("| case | eager ms | compile ms | difflet ms | difflet / eager | difflet / compile | "
          "peak MB eager / difflet | TFLOP | TFLOPS eager / difflet | linear TFLOPS |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    f = lambda row, k, p=0: f"{row[k]:.{p}f}" if k in row else "-"  # noqa: E731
    for case, r in result.items():
        print(f"| {case} | {f(r, 'eager_ms')} | {f(r, 'compile_ms')} | {f(r, 'difflet_ms')} | "
              f"{f(r, 'difflet_vs_eager', 2)} | {f(r, 'difflet_vs_compile', 2)} | "
              f"{f(r, 'eager_peak_mb')} / {f(r, 'difflet_peak_mb')} | {f(r, 'tflop', 2)} | "
              f"{f(r, 'eager_tflops', 3)} / {f(r, 'difflet_tflops', 3)} | {f(r, 'linear_tflops', 3)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
