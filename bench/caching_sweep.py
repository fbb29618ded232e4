"""Step caching's PSNR against compute on any family's description (random weights), against fewer steps.

bench/caching_quality.py's sweep, PSNR only, on a `--model` description (the bench ones:
models/{flux,qwen-image,wan2.1,hunyuan-video,ltx2}-bench.dsl) with random weights (`random:0`,
as bench/caching.py): the first `--prompts` of bench/caching.py's evaluation prompts x `--seeds`
run through the compiled pipeline (tp1, cpu, inductor; `--eager`: the same modules uncompiled)
once uncached at `--steps` (the reference), then once per row:
  fewer-steps    uncached at N steps (setting = N): caching_quality's counts scaled to `--steps`,
                 plus the call count of every cadence row (so each has a baseline at its compute)
  cadence / online-delta   every mode string of caching_quality.settings: cadence:{2,3,4,6} and
                 online-delta:{0.6,1.5,3}, each with the delta estimator and +forecast:{0,1,2},
                 at keep 5:5 and at every `--keep` (default 2,1: the only way under 0.4 compute)
Per row (caching_quality's JSON row without the prompt-following fields): {mode, setting, compute
(mean denoiser calls / `--steps`; a classifier-free-guidance step's two passes count as one), wall_s
(mean seconds per output), psnr, psnr_min (mean and min over the outputs, dB, 8-bit pixels, a video
over all its frames' pixels, against the uncached output of the same prompt and seed; null for the
reference itself)}. The summary below the table pairs the best caching row at <= 0.4 compute, the
best at 0.5-0.7 and cadence:2 with the fewer-steps row of the most steps not above its compute.

The weights are random: the outputs are noise-like pictures that barely move between steps, so a
PSNR here is evidence about numerical fidelity to the uncached computation, not image quality.

    python bench/caching_sweep.py --model models/flux-bench.dsl [--weights random:0] [--prompts 3]
        [--seeds 0 1] [--steps 28] [--keep 2,1 ...] [--store DIR | --eager]
        [--out bench/results/caching_sweep_flux-bench]
--out PREFIX writes PREFIX.json (the rows) and PREFIX.md (the table sorted by compute, then the
summary). Torch runs single-threaded.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import caching, caching_quality as cq  # noqa: E402

DEFAULT_STORE = REPO / ".pytest_cache" / "difflet-store"  # bench/caching.py's
BANDS = (("best at <= 0.4", 0.0, 0.4), ("best at 0.5-0.7", 0.5, 0.7))


def build_runner(model: str, weights: str = "random:0", store: str | Path = DEFAULT_STORE, eager: bool = False):
    """A runner of MODEL: compiled through STORE as bench/caching.py builds it, or its uncompiled
    modules (`eager`; STORE then only holds the materialized weights)."""
    from difflet.runtime import demo
    from difflet.runtime.runner import ModelRunner

    demo.quiet_libraries()
    if eager:
        from difflet.codegen.artifacts import eager_programs
        from difflet.codegen.checkpoint import resolve_weights
        from difflet.frontend.lower import lower_file
        from difflet.passes.pipeline import optimize

        module = optimize(lower_file(model), parallel="tp1", target="cpu", backend="inductor")
        ckpt = resolve_weights(module, weights, Path(store))
        return ModelRunner(module, eager_programs(module, ckpt), ckpt)
    art = caching.build(model, weights, str(store), Path(tempfile.mkdtemp(prefix="caching-sweep-")) / "art")
    return ModelRunner.from_artifacts(art)


def fewer_counts(steps: int, keeps: list[tuple[int, int]]) -> list[int]:
    """caching_quality.FEWER (chosen for 28 steps) scaled to `steps`, plus every cadence row's calls."""
    from difflet.stepcache.calibrate import cadence_budget

    scaled = {max(1, round(n * steps / 28)) for n in cq.FEWER}
    cadence = {steps - cadence_budget(steps, n, keep) for n in cq.CADENCES for keep in keeps}
    return sorted(n for n in scaled | cadence if n < steps)


def _better(a: dict, b: dict | None) -> bool:
    """Row a has a higher mean PSNR than b (null = identical to the reference, the highest)."""
    inf = float("inf")
    return b is None or (inf if a["psnr"] is None else a["psnr"]) > (inf if b["psnr"] is None else b["psnr"])


def highlights(rows: list[dict]) -> list[tuple[str, dict, dict | None]]:
    """(label, caching row, fewer-steps row) for each band's best caching row and cadence:2; the
    fewer-steps row is the one of the most steps whose compute is not above the caching row's."""
    cached = [r for r in rows if r["mode"] not in ("off", "fewer-steps")]
    fewer = sorted((r for r in rows if r["mode"] == "fewer-steps"), key=lambda r: r["compute"])
    picks = []
    for label, low, high in BANDS:
        best = None
        for r in cached:
            if low - 1e-9 <= r["compute"] <= high + 1e-9 and _better(r, best):
                best = r
        if best is not None:
            picks.append((label, best))
    picks += [("cadence 2", r) for r in cached if r["setting"] == "cadence:2"]
    out = []
    for label, r in picks:
        below = [f for f in fewer if f["compute"] <= r["compute"] + 1e-9]
        out.append((label, r, below[-1] if below else None))
    return out


def summary(rows: list[dict]) -> str:
    """The highlights as a markdown table (PSNR mean (min) dB; difference of the means)."""
    def cell(r):
        return f"{cq.db(r['psnr'])} ({cq.db(r['psnr_min'])})"

    lines = ["", "| comparison | caching row | compute | PSNR mean (min) dB | fewer steps | compute | "
             "PSNR mean (min) dB | difference dB |", "|---|---|---:|---|---:|---:|---|---:|"]
    for label, r, f in highlights(rows):
        diff = "-" if f is None or None in (r["psnr"], f["psnr"]) else f"{r['psnr'] - f['psnr']:+.1f}"
        lines.append(f"| {label} | {r['setting']} | {r['compute']:.2f} | {cell(r)} | "
                     + (f"{f['setting']} | {f['compute']:.2f} | {cell(f)} | " if f else "- | - | - | ") + f"{diff} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a description, e.g. models/flux-bench.dsl")
    ap.add_argument("--weights", default="random:0")
    ap.add_argument("--prompts", type=int, default=3, help="the first N of bench/caching.py's EVAL_PROMPTS")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=28)
    ap.add_argument("--keep", type=cq.keep_pair, action="append", default=None,
                    help="every caching mode also with these kept steps, as INITIAL,FINAL (default 2,1)")
    ap.add_argument("--store", type=Path, default=None, help=f"program store (default {DEFAULT_STORE})")
    ap.add_argument("--eager", action="store_true", help="uncompiled programs (no compile)")
    ap.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    args = ap.parse_args(argv)
    if not 1 <= args.prompts <= len(caching.EVAL_PROMPTS):
        ap.error(f"--prompts must be in [1, {len(caching.EVAL_PROMPTS)}]")
    if not 12 <= args.steps <= 1000:
        ap.error("--steps must be in [12, 1000] (5 + 5 kept steps and a window)")
    keeps = [(5, 5)] + [k for k in (args.keep or [(2, 1)]) if k != (5, 5)]
    torch.set_num_threads(1)
    jobs = [(p, s) for p in caching.EVAL_PROMPTS[:args.prompts] for s in args.seeds]
    runner = build_runner(args.model, args.weights, args.store or DEFAULT_STORE, args.eager)
    try:
        rows = cq.sweep(runner, jobs, args.steps, cq.settings(keeps), fewer=fewer_counts(args.steps, keeps),
                        log=lambda line: print(line, flush=True), text=str, score=None)
    finally:
        runner.close()
    name = Path(args.model).stem
    title = (f"{name} ({args.model}, {args.weights}: random weights), {args.steps} steps, {len(jobs)} outputs "
             f"({args.prompts} prompts x seeds {' '.join(map(str, args.seeds))}), "
             f"{'eager' if args.eager else 'compiled'}; PSNR against the uncached {args.steps}-step output")
    text = summary(rows)
    print(cq.table(rows, title) + text)
    if args.out:
        cq.write(rows, args.out, title, png=False, extra=text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
