"""LoRA adapters: what switching between them costs, in time and memory, with nothing compiled.

Cases: the bundled flux-shapes model (its trained weights) and FLUX at real width (bench/denoiser_cases.py
flux512-bf16: 24 heads x 128, 1 double + 1 single block, random weights, tiny encoders and VAE). Per case,
two rank-16 adapters (alpha 16) on every attention and feed-forward linear of the denoiser, made with peft
and saved with FluxPipeline.save_lora_weights, are loaded into one DiffletPipeline; then, side by side in
one process:
  load_ms      reading one adapter (diffusers' loader + PEFT layers on a meta model);
  switch_ms    median time to make the programs serve another adapter (a merge of every adapted weight
               from the checkpoint values plus one partial constant update), over --switches alternations;
  request_ms   one request (--steps steps) under the base weights and under an adapter, after its switch
               (an adapter adds nothing per step: the merged weights are the program's constants);
  adapter_mb   one adapter's factors; adapted_mb: the weights a switch rewrites in place (no copy kept);
  rss_mb       the process's resident memory before loading the adapters, after loading them and after
               the switches (before any request, whose activations would blur it);
  compiles     program-store entries written while loading and switching (must be 0).
Prints JSON and a markdown table (also to bench/results/lora.{json,md} with --save).

  python bench/lora.py [--cases flux-shapes,flux512-bf16] [--switches 5] [--steps 2] [--save]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from denoiser_cases import CASES, REPO, dsl  # noqa: E402

TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
           "ff.net.0.proj", "ff.net.2", "proj_mlp", "proj_out"]


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _adapter(config: dict, dest: Path, seed: int) -> Path:
    """A rank-16 adapter of a FluxTransformer2DModel of `config`, nonzero B (as a trained one)."""
    import torch
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    model = FluxTransformer2DModel.from_config(config)
    lora = LoraConfig(r=16, lora_alpha=16, target_modules=TARGETS, init_lora_weights="gaussian")
    model.add_adapter(lora)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
    dest.mkdir(parents=True)
    FluxPipeline.save_lora_weights(str(dest), transformer_lora_layers=get_peft_model_state_dict(model),
                                   transformer_lora_adapter_metadata=lora.to_dict())
    return dest / "pytorch_lora_weights.safetensors"


def measure(case: str, work: Path, switches: int, steps: int) -> dict:
    from difflet.pipeline import DiffletPipeline

    if case == "flux-shapes":
        weights, model = REPO / "difflet" / "assets" / "flux-shapes", "flux-shapes"
    else:
        weights, model = "random:0", work / f"{case}.dsl"
        model.write_text(dsl(CASES[case]))
    store = work / "store"
    with DiffletPipeline.from_pretrained(weights, model=model, store=store) as pipe:
        runner = pipe.runner
        (den,) = runner.module.components("denoiser")
        config = den.attrs["config"].to_python()
        files = [_adapter(config, work / case / name, seed) for seed, name in enumerate(("a", "b"))]
        entries = sum(1 for _ in store.rglob("*.pt2"))
        rss0 = _rss_mb()
        loads = []
        for name, path in zip(("a", "b"), files):
            t0 = time.perf_counter()
            runner.load_loras([(name, str(path), 1.0)])
            loads.append((time.perf_counter() - t0) * 1e3)
        rss_loaded = _rss_mb()
        times = []
        for i in range(switches):
            t0 = time.perf_counter()
            runner.lora._apply(("a:1.0", "b:1.0")[i % 2])
            times.append((time.perf_counter() - t0) * 1e3)
        rss_switched = _rss_mb()

        def request(lora: str) -> float:
            pipe("a red circle", seed=0, num_inference_steps=steps, lora=lora)  # its switch, if any
            t0 = time.perf_counter()
            pipe("a red circle", seed=0, num_inference_steps=steps, lora=lora)
            return (time.perf_counter() - t0) * 1e3

        base_ms, adapter_ms = request(""), request("a:0.8")
        adapted = sum(t.holder.read_base(f).nbytes for t in runner.lora._targets for f in t.fqn.values())
        return {"case": case, "adapted_weights": len(runner.lora._targets[0].fqn),
                "load_ms": statistics.median(loads), "switch_ms": statistics.median(times),
                "switch_max_ms": max(times), "request_base_ms": base_ms, "request_adapter_ms": adapter_ms,
                "steps": steps, "adapter_mb": runner.lora.adapters["a"].nbytes / 2**20,
                "adapted_mb": adapted / 2**20, "rss_before_mb": rss0, "rss_loaded_mb": rss_loaded,
                "rss_switched_mb": rss_switched,
                "compiles": sum(1 for _ in store.rglob("*.pt2")) - entries}


def table(rows: list[dict]) -> str:
    out = ["| case | adapted weights | load ms | switch ms (max) | request ms base / adapter | adapter MB | "
           "adapted MB | RSS MB before / loaded / switched | compiles |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['case']} | {r['adapted_weights']} | {r['load_ms']:,.0f} | {r['switch_ms']:,.1f} "
                   f"({r['switch_max_ms']:,.1f}) | {r['request_base_ms']:,.0f} / {r['request_adapter_ms']:,.0f} | "
                   f"{r['adapter_mb']:.1f} | {r['adapted_mb']:.1f} | {r['rss_before_mb']:,.0f} / "
                   f"{r['rss_loaded_mb']:,.0f} / {r['rss_switched_mb']:,.0f} | {r['compiles']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="flux-shapes,flux512-bf16")
    ap.add_argument("--switches", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--work", default=None, help="work directory (program store); default: a temporary one")
    ap.add_argument("--save", action="store_true", help="also write bench/results/lora.{json,md}")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="difflet-bench-lora-"))
    rows = [measure(case, work, args.switches, args.steps) for case in args.cases.split(",")]
    md = table(rows)
    print(json.dumps(rows, indent=1))
    print(md)
    if args.save:
        (REPO / "bench" / "results" / "lora.json").write_text(json.dumps(rows, indent=1) + "\n")
        (REPO / "bench" / "results" / "lora.md").write_text(
            f"cpu, {args.switches} switches, {args.steps}-step requests, rank-16 adapters\n\n{md}\n")


if __name__ == "__main__":
    main()
