"""The prepared accelerator check (issue 34 item 6), run by bench/device_check.sh in one call.

Stages, in order of what they prove (each writes its result into OUT/device_check.json as soon as
it ends, so a run cut short still reports the stages before the cut):
  env       torch / CUDA / GPU identity and the versions of the libraries Difflet imports.
  served    one tiny request served through the whole product (`difflet demo`: lower, opt, codegen,
            difflet-runtime, a gRPC request) for --target cpu and for the device's target, with
            one program store; the two PNGs compared with tests/oracle_util.py's closeness rule.
  flux      the full-depth FLUX.1-dev transformer (19 double + 38 single blocks, random bf16
            weights built on the device, 1024x1024: 4,096 visual + 512 text tokens) per denoiser
            call: diffusers eager, diffusers + torch.compile (default mode) and Difflet's program
            (the denoiser codegen builds: Difflet's attention installed, torch.export +
            AOTInductor, weights outside the program, bound to the module's own tensors); compile
            seconds, median ms, peak device memory, and each output's cosine to eager.
  attention bench/attention_kernel.py on the device (bounded attention vs SDPA with a mask).

--dry-run runs every stage on this machine's CPU at toy size (FLUX 1 + 1 blocks at 256x256,
the served request on --target cpu twice, the attention bench at 256 tokens): the code paths,
arguments and JSON of the real run, not its numbers.

  python bench/device_check.py --out DIR [--dry-run] [--stages env,served,flux,attention]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))
STAGES = ("env", "served", "flux", "attention")
SERVED_MODEL = "flux-tiny"


def _env(dev: str) -> dict:
    import diffusers
    import torch
    import transformers

    out = {"torch": torch.__version__, "diffusers": diffusers.__version__,
           "transformers": transformers.__version__, "python": sys.version.split()[0], "device": dev}
    if dev == "cuda":
        props = torch.cuda.get_device_properties(0)
        out.update(gpu=props.name, sm_count=props.multi_processor_count, memory_gib=props.total_memory / 2**30,
                   cuda=torch.version.cuda)
    return out


def _demo(target: str, store: Path, png: Path, log: Path) -> float:
    """`difflet demo` of SERVED_MODEL for `target` into `png`; its wall seconds (compile included)."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "difflet.cli", "demo", "--model", SERVED_MODEL, "--target", target,
           "--store", str(store), "-o", str(png)]
    with open(log, "a") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
    return time.perf_counter() - t0


def _served(dev: str, out: Path) -> dict:
    """The same request served for the CPU and for `dev` (on a dry run: the CPU again, from a
    second store, so the second leg compiles its own programs as the device's leg does)."""
    import numpy as np
    from PIL import Image

    from oracle_util import image_match, images_close

    log = out / "served.log"
    cpu_s = _demo("cpu", out / "served-store", out / "served-cpu.png", log)
    dev_s = _demo(dev, out / f"served-store-{dev}", out / "served-device.png", log)
    a, b = (np.asarray(Image.open(out / f"served-{leg}.png")) for leg in ("cpu", "device"))
    worst, same, db = image_match(b, a)
    return {"model": SERVED_MODEL, "cpu_s": cpu_s, "device_s": dev_s, "max_pixel_diff": worst,
            "identical": same, "psnr_db": db, "close": images_close(b, a)}


def _timed(call, repeats: int, sync) -> dict:
    t0 = time.perf_counter()
    first = call()
    sync()
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"first_s": first_s, "ms": statistics.median(times), "out": first}


def _flux(dev: str, depth: tuple[int, int], px: int, repeats: int, out: Path, record) -> dict:
    """Eager, torch.compile and Difflet's program of one FLUX transformer, in one process (the
    weights built once on the device; each variant's peak is the device's high-water mark)."""
    import diffusers
    import torch

    from denoiser_cases import FLUX_CONFIG, Case, dsl, eager_inputs, program_values
    from difflet.codegen.build import wrap_program_module
    from difflet.codegen.inductor import PROGRAM_FILE, attach_constants, compile_entry, program_weights
    from difflet.frontend.lower import lower_text
    from difflet.passes.pipeline import optimize
    from difflet.runtime.invoke import bind_inputs

    cuda = dev == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    case = Case("flux", "bf16", px)
    config = {**FLUX_CONFIG, "num_layers": depth[0], "num_single_layers": depth[1]}
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 on the device: never an fp32 copy
    with torch.device(dev):
        model = diffusers.FluxTransformer2DModel(**config).eval()
    torch.set_default_dtype(torch.float32)
    kw = eager_inputs(case, torch.device(dev))
    result = {"blocks": list(depth), "px": px, "tokens": case.tokens,
              "params_b": sum(p.numel() for p in model.parameters()) / 1e9}

    def measured(name: str, call) -> torch.Tensor:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        with torch.inference_mode():
            r = _timed(call, repeats, sync)
        result[name] = {"first_s": r["first_s"], "ms": r["ms"]}
        if cuda:
            result[name]["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        record(result)
        return r["out"].float().flatten()

    ref = measured("eager", lambda: model(**kw, return_dict=False)[0])
    compiled = torch.compile(model)
    got = measured("compile", lambda: compiled(**kw, return_dict=False)[0])
    result["compile"]["cos_to_eager"] = float(torch.nn.functional.cosine_similarity(got, ref, dim=0))
    del compiled
    torch._dynamo.reset()

    text = dsl(case).replace('"num_layers": 1', f'"num_layers": {depth[0]}')
    text = text.replace('"num_single_layers": 1', f'"num_single_layers": {depth[1]}')
    module = optimize(lower_text(text, "flux-full.dsl"), parallel="tp1", target="cuda" if cuda else "cpu",
                      backend="inductor")
    node = module.component("transformer")
    pm = wrap_program_module(model, node, "inductor")  # Difflet's attention, as codegen builds it
    entry = out / "flux-program"
    entry.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    compile_entry(node, pm, entry, device=dev)
    result["difflet_compile_s"] = time.perf_counter() - t0
    from torch._inductor.package import load_package

    program = load_package(str(entry / PROGRAM_FILE))
    # the module's own device tensors as the program's constants: one copy of the weights
    keep = attach_constants(lambda c, um: program.load_constants(c, check_full_update=True, user_managed=um),
                            program.get_metadata(), program_weights(pm, entry))
    args = [a.to(dev) for a in bind_inputs(node, program_values(case, kw))]
    got = measured("difflet", lambda: program(*args)[0])
    result["difflet"]["cos_to_eager"] = float(torch.nn.functional.cosine_similarity(got, ref, dim=0))
    del keep
    for base in ("eager", "compile"):
        result[f"difflet_vs_{base}"] = result["difflet"]["ms"] / result[base]["ms"]
    return result


def _attention(dev: str, out: Path, dry: bool) -> dict:
    cmd = [sys.executable, str(REPO / "bench" / "attention_kernel.py"), "--device", dev,
           "--json", str(out / "attention.json")]
    cmd += ["--seq", "256", "--repeats", "1", "--dtypes", "fp32"] if dry else ["--repeats", "5"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    return json.loads((out / "attention.json").read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for device_check.json and the PNGs")
    ap.add_argument("--dry-run", action="store_true", help="every stage on this CPU at toy size")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    stages = args.stages.split(",")
    if unknown := [s for s in stages if s not in STAGES]:
        print(f"error: --stages: unknown {unknown}; known: {', '.join(STAGES)}", file=sys.stderr)
        return 2
    import torch

    dev = "cpu" if args.dry_run else "cuda"
    if not args.dry_run and not torch.cuda.is_available():
        print("error: no CUDA device here (torch.cuda.is_available() is False); try --dry-run", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"dry_run": args.dry_run, "stages": {}}
    path = args.out / "device_check.json"

    def record(name: str, value) -> None:
        report["stages"][name] = value
        path.write_text(json.dumps(report, indent=1) + "\n")

    runs = {"env": lambda: _env(dev), "served": lambda: _served(dev, args.out),
            "flux": lambda: _flux(dev, (1, 1) if args.dry_run else (19, 38), 256 if args.dry_run else 1024,
                                  1 if args.dry_run else args.repeats, args.out, lambda r: record("flux", r)),
            "attention": lambda: _attention(dev, args.out, args.dry_run)}
    failed = 0
    for name in stages:
        t0 = time.perf_counter()
        print(f"[device_check] {name} ...", flush=True)
        try:
            value = runs[name]()
        except Exception as err:  # a stage's failure is a result too: report it, go on with the next
            failed += 1
            value = {**report["stages"].get(name, {}), "error": f"{type(err).__name__}: {err}"[-2000:]}
        value["stage_s"] = time.perf_counter() - t0
        record(name, value)
        print(f"[device_check] {name}: {json.dumps(value)[:600]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
