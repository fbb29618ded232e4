"""Block mode on the trained flux-shapes model, beside fewer steps at equal compute.

The bundled flux-shapes description is compiled with `difflet opt --front-blocks K` (its
denoiser: 2 double-stream + 4 single-stream blocks), then every caption of
difflet.train.shapes_data x `--seeds` runs uncached at `--steps` (the reference), uncached at
fewer steps, and under `block:THRESHOLD` for each threshold x keep x estimator (the rest's
last residual, or `+forecast:1`). Front and rest are Difflet's compiled programs, served by the
same runner difflet-runtime uses.

Compute per image, as a fraction of the uncached denoiser's: (rest calls + front calls x
front_cost) / steps, where front_cost = (front program time) / (front + rest time) on the
denoiser's example inputs (median of `--timing-calls` alternating calls): a full step runs both
programs, a cached step the front only; fewer steps cost N / steps. The other columns are
bench/caching_quality.py's (its `score` and `table`): prompt following in percent and PSNR
(mean, min; dB, 8-bit pixels) against the uncached image.

    python bench/caching_blocks.py [--front-blocks 1] [--seeds 0 1] [--captions N] [--steps 28]
                                   [--thresholds 0.05 0.1 ...] [--keep 2,1] [--store DIR] [--out PREFIX]
--out PREFIX writes PREFIX.json (caching_quality.py's rows, plus `front_cost`) and PREFIX.md.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

THRESHOLDS = (0.03, 0.06, 0.1, 0.15, 0.25, 0.4)
FEWER = (6, 8, 10, 11, 12, 14)


def build(front_blocks: int, store: Path):
    """A ModelRunner of flux-shapes compiled with the denoiser cut after `front_blocks` blocks."""
    from difflet.codegen.driver import codegen
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize
    from difflet.runtime import demo
    from difflet.runtime.runner import ModelRunner

    demo.quiet_libraries()
    dsl, weights = demo.MODELS["flux-shapes"]
    module = optimize(lower_file(str(dsl)), parallel="tp1", target="cpu", backend="inductor",
                      front_blocks=front_blocks)
    art = Path(tempfile.mkdtemp(prefix="caching-blocks-")) / "art"
    codegen(module, weights, art, backend="inductor", store=store, log=lambda *a: None)
    return ModelRunner.from_artifacts(art)


def front_cost(runner, calls: int) -> float:
    """front time / (front + rest time), medians over alternating calls on example inputs."""
    from difflet.codegen.build import example_inputs

    name = next(n for n, c in runner.manifest.components.items() if c.parts)
    block = runner.env.programs[name]._runner
    inputs = example_inputs(runner.env.component(name))
    fronts, rests = [], []
    with torch.no_grad():
        outputs, streams = block.front(inputs, block.zero_residuals())
        for _ in range(calls):
            start = time.perf_counter()
            block.front(inputs, block.zero_residuals())
            fronts.append(time.perf_counter() - start)
            start = time.perf_counter()
            block.rest(inputs, streams)
            rests.append(time.perf_counter() - start)
    front, rest = statistics.median(fronts), statistics.median(rests)
    return front / (front + rest)


def run(runner, jobs, steps: int, plan, cost: float):
    """(images, compute fraction, seconds per image) of every job under `plan`."""
    from caching_quality import caption_of

    images, compute, seconds = [], 0.0, 0.0
    for (c, seed) in jobs:
        params = replace(runner.resolve(prompt=caption_of(c), seed=seed, steps=steps), cache=plan)
        start = time.perf_counter()
        result = runner.generate(params)
        seconds += time.perf_counter() - start
        images.append(result.image)
        stats = result.stats
        if "front_calls" in stats:
            compute += stats["rest_calls"] + stats["front_calls"] * cost
        else:
            compute += stats.get("denoiser_calls", steps)
    return np.stack(images), compute / len(jobs), seconds / len(jobs)


def sweep(runner, jobs, steps: int, modes: list[str], cost: float, log=print) -> list[dict]:
    from caching_quality import score

    from difflet.stepcache.calibrate import psnr
    from difflet.stepcache.modes import parse_mode
    from difflet.stepcache.plan import OFF, CachePlan

    reference, _, ref_s = run(runner, jobs, steps, OFF, cost)
    rows = []

    def row(mode, setting, images, compute, secs):
        values = [psnr(a, b) for a, b in zip(images, reference)]
        finite = [v for v in values if math.isfinite(v)]
        rows.append({"mode": mode, "setting": setting, "compute": round(compute / steps, 4),
                     "wall_s": round(secs, 4), **{k: round(v, 2) for k, v in score(images, jobs).items()},
                     "psnr": round(float(np.mean(finite)), 2) if finite else None,
                     "psnr_min": round(float(min(values)), 2) if finite else None,
                     "front_cost": round(cost, 4)})
        log(json.dumps(rows[-1]))

    row("off", str(steps), reference, steps, ref_s)
    for n in FEWER:
        if n < steps:
            row("fewer-steps", str(n), *run(runner, jobs, n, OFF, cost))
    for spec in modes:
        mode = parse_mode(spec, "mode")
        row(mode.kind, mode.spec(), *run(runner, jobs, steps, CachePlan(mode), cost))
    return rows


def keep_pair(text: str) -> tuple[int, int]:
    try:
        initial, final = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--keep takes INITIAL,FINAL (two integers), got {text!r}") from None
    if initial < 1 or final < 0:
        raise argparse.ArgumentTypeError("--keep: INITIAL >= 1 (the rest must run once), FINAL >= 0")
    return initial, final


def main(argv=None) -> int:
    from caching_quality import table

    from difflet.codegen.store import default_store_dir
    from difflet.train import DEFAULT_STEPS
    from difflet.train.shapes_data import CAPTIONS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--front-blocks", type=int, default=1)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--captions", type=int, default=len(CAPTIONS), help="the first N captions")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    ap.add_argument("--thresholds", type=float, nargs="+", default=list(THRESHOLDS))
    ap.add_argument("--keep", type=keep_pair, action="append", default=[],
                    help="also every threshold with these kept steps, as INITIAL,FINAL")
    ap.add_argument("--timing-calls", type=int, default=50)
    ap.add_argument("--store", type=Path, default=None, help="program store (default: the user's)")
    ap.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    args = ap.parse_args(argv)
    if not 1 <= args.captions <= len(CAPTIONS):
        ap.error(f"--captions must be in [1, {len(CAPTIONS)}]")
    if not 12 <= args.steps <= 1000:
        ap.error("--steps must be in [12, 1000] (5 + 5 kept steps and a window)")
    if not 1 <= args.timing_calls <= 10000:
        ap.error("--timing-calls must be in [1, 10000]")
    torch.set_num_threads(1)
    runner = build(args.front_blocks, args.store or default_store_dir())
    modes = []
    for initial, final in [(5, 5), *args.keep]:
        keep = "" if (initial, final) == (5, 5) else f"+keep:{initial}:{final}"
        modes += [f"block:{t:g}{est}{keep}" for t in args.thresholds for est in ("", "+forecast:1")]
    jobs = [(c, s) for c in CAPTIONS[:args.captions] for s in args.seeds]
    try:
        cost = front_cost(runner, args.timing_calls)
        rows = sweep(runner, jobs, args.steps, modes, cost, log=lambda line: print(line, flush=True))
    finally:
        runner.close()
    title = (f"flux-shapes, block mode with the front = {args.front_blocks} of 6 blocks (front cost "
             f"{cost:.3f} of a full step), {args.steps} steps, {len(jobs)} images; PSNR against the "
             f"uncached {args.steps}-step image")
    print(table(rows, title))
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(rows, indent=1) + "\n")
        Path(args.out + ".md").write_text(table(rows, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
