"""Step caching's quality/speed frontier on the trained flux-shapes model, against fewer steps.

Every caption of difflet.train.shapes_data x `--seeds` runs through Difflet's compiled
flux-shapes pipeline (models/flux-shapes.dsl, tp1, cpu, inductor; the code path difflet-runtime
serves) once uncached at `--steps` (the reference), then once per mode and setting:
  off            uncached, `--steps` steps (compute 1.0)
  fewer-steps    uncached, N steps (the baseline at equal compute; setting = N)
  cadence        cadence:N with the delta estimator (prev + last change), `+forecast:K` variants
  online-delta   online-delta:ALPHA, likewise
Per row: compute = mean denoiser calls / `--steps` (a cached step calls no program: its cost is
host arithmetic, reported in wall_s), wall_s = mean seconds per image (generate only), the
checker's prompt following in percent (colour = the shape's colour, background, shape;
difflet.train.checker, about 100% on ground-truth images) and PSNR (mean and min over images,
dB, 8-bit pixels) against the uncached `--steps` image of the same caption and seed.

The keep counts (full steps before and after the cacheable window, 5 + 5 by default) bound how
little a mode can compute: at 28 steps 10 of 28 calls (0.36) are always made. `--keep I,F`
adds every caching mode again with I + F kept steps (`+keep:I:F`; repeatable).

    python bench/caching_quality.py [--seeds 0 1] [--captions N] [--steps 28] [--keep 2,1]
                                    [--store DIR | --eager] [--out PREFIX]
--eager runs the modules codegen would compile, uncompiled (no compile; tests use it).
--out PREFIX writes PREFIX.json (a list of rows {mode, setting, compute, wall_s, colour,
background, shape, psnr, psnr_min}; psnr null for the reference itself), PREFIX.md (the table, rows sorted by compute) and, with
matplotlib (`pip install -e '.[bench]'`), PREFIX.png: compute against PSNR and against the mean
of the three prompt-following scores, one line per mode family (decision + estimator + keep).
`--replot PREFIX` redraws PREFIX.md and PREFIX.png from PREFIX.json (the title from PREFIX.md's first
line) without running anything.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CADENCES = (2, 3, 4, 6)
ALPHAS = (0.6, 1.5, 3.0)
FORECASTS = (None, 0, 1, 2)
FEWER = (8, 10, 11, 12, 14, 16, 19, 22)


def settings(keeps: list[tuple[int, int]]) -> list[str]:
    """Every caching mode string of the sweep."""
    out = []
    for initial, final in keeps:
        keep = "" if (initial, final) == (5, 5) else f"+keep:{initial}:{final}"
        for base in [f"cadence:{n}" for n in CADENCES] + [f"online-delta:{a:g}" for a in ALPHAS]:
            out += [base + ("" if order is None else f"+forecast:{order}") + keep for order in FORECASTS]
    return out


def score(images: np.ndarray, jobs) -> dict[str, float]:
    """The checker's three prompt-following scores in percent (bench/prompt_following.py's count)."""
    from bench.prompt_following import score as hits_of

    hits, _ = hits_of(images, jobs)
    n = len(jobs)
    return {"colour": 100.0 * hits["fg"] / n, "background": 100.0 * hits["bg"] / n,
            "shape": 100.0 * hits["shape"] / n}


def caption_of(job) -> str:
    """The prompt of a flux-shapes caption tuple (a job's first item)."""
    from difflet.train.shapes_data import caption

    return caption(*job)


def run_all(runner, jobs, steps: int, plan, text=caption_of) -> tuple[np.ndarray, float, float]:
    """(outputs, mean denoiser calls, mean seconds) of every (prompt, seed) job at `steps` under
    cache `plan`; text(prompt) is the prompt string; an output is an image, or a video's frames."""
    images, calls, seconds = [], 0, 0.0
    for (c, seed) in jobs:
        params = replace(runner.resolve(prompt=text(c), seed=seed, steps=steps), cache=plan)
        start = time.perf_counter()
        result = runner.generate(params)
        seconds += time.perf_counter() - start
        images.append(result.image if result.image is not None else result.video)
        calls += result.stats.get("denoiser_calls", steps)
    return np.stack(images), calls / len(jobs), seconds / len(jobs)


def sweep(runner, jobs, steps: int, modes: list[str], fewer=FEWER, log=print, text=caption_of,
          score=score) -> list[dict]:
    """Rows of the uncached reference, `fewer` uncached step counts and every mode string;
    score=None: PSNR only (no prompt-following fields)."""
    from difflet.stepcache.calibrate import psnr
    from difflet.stepcache.modes import parse_mode
    from difflet.stepcache.plan import CachePlan, OFF

    reference, _, ref_s = run_all(runner, jobs, steps, OFF, text)
    rows = []

    def row(mode: str, setting: str, images, calls: float, secs: float) -> None:
        values = [psnr(a, b) for a, b in zip(images, reference)]
        finite = [v for v in values if math.isfinite(v)]
        rows.append({"mode": mode, "setting": setting, "compute": round(calls / steps, 4),
                     "wall_s": round(secs, 4),
                     **({k: round(v, 2) for k, v in score(images, jobs).items()} if score else {}),
                     "psnr": round(float(np.mean(finite)), 2) if finite else None,  # None: identical
                     "psnr_min": round(float(min(values)), 2) if finite else None})
        log(json.dumps(rows[-1]))

    row("off", str(steps), reference, steps, ref_s)
    for n in fewer:
        if n < steps:
            images, calls, secs = run_all(runner, jobs, n, OFF, text)
            row("fewer-steps", str(n), images, calls, secs)
    for spec in modes:
        parsed = parse_mode(spec, "mode")
        images, calls, secs = run_all(runner, jobs, steps, CachePlan(parsed), text)
        row(parsed.kind, parsed.spec(), images, calls, secs)
    return rows


def db(value: float | None) -> str:
    return "identical" if value is None else f"{value:.1f}"


def table(rows: list[dict], header: str) -> str:
    """The rows sorted by compute; the prompt-following columns only where the rows have them."""
    scored = all("colour" in r for r in rows)
    lines = [header, "", "| mode | setting | compute | s/image | " + ("colour % | background % | shape % | " if scored
             else "") + "PSNR mean dB | PSNR min dB |", "|---|---|---:|---:|" + "---:|" * (5 if scored else 2)]
    for r in sorted(rows, key=lambda r: (-r["compute"], r["mode"], r["setting"])):
        lines.append(f"| {r['mode']} | {r['setting']} | {r['compute']:.3f} | {r['wall_s']:.3f} | "
                     + (f"{r['colour']:.1f} | {r['background']:.1f} | {r['shape']:.1f} | " if scored else "")
                     + f"{db(r['psnr'])} | {db(r['psnr_min'])} |")
    return "\n".join(lines) + "\n"


def family(row: dict) -> tuple[str, str, str]:
    """(decision, estimator, keep) of a row: the line it belongs to in the plot."""
    if row["mode"] in ("off", "fewer-steps"):
        return "fewer steps", "", ""
    decision, *options = row["setting"].split("+")
    estimator = next((o for o in options if o.startswith("forecast")), "delta")
    keep = next((o for o in options if o.startswith("keep")), "keep:5:5")
    return decision.split(":")[0], estimator, keep


def plot(rows: list[dict], path: str, title: str) -> None:
    """Colour = estimator, line style = decision, marker = keep; fewer steps thick and black."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[tuple[str, str, str], list[dict]] = {}
    for r in rows:
        lines.setdefault(family(r), []).append(r)
    colours = {"delta": "tab:gray", "forecast:0": "tab:blue", "forecast:1": "tab:red", "forecast:2": "tab:green"}
    markers = {"keep:5:5": "o", "keep:2:1": "^", "keep:3:2": "s"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))
    for key, members in sorted(lines.items()):
        decision, estimator, keep = key
        members.sort(key=lambda r: r["compute"])
        x = [r["compute"] for r in members]
        if decision == "fewer steps":
            style = dict(color="black", linewidth=3, marker="o", label="fewer steps (uncached)")
        else:
            style = dict(color=colours.get(estimator, "tab:purple"), marker=markers.get(keep, "x"), linewidth=1,
                         linestyle="-" if decision == "cadence" else "--", label=f"{decision} {estimator} {keep}")
        left.plot(x, [80.0 if r["psnr"] is None else min(r["psnr"], 80.0) for r in members], **style)
        right.plot(x, [(r["colour"] + r["background"] + r["shape"]) / 3 for r in members], **style)
    left.set(xlabel="denoiser compute (fraction of uncached)", ylabel="PSNR vs uncached, mean dB (capped at 80)")
    right.set(xlabel="denoiser compute (fraction of uncached)", ylabel="prompt following, mean of 3 scores %")
    left.grid(alpha=0.3)
    right.grid(alpha=0.3)
    right.legend(fontsize=6, ncol=2, loc="lower right")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(rows: list[dict], prefix: str, title: str, png: bool = True, extra: str = "") -> None:
    """PREFIX.json (the rows), PREFIX.md (the table, then `extra`) and, with `png`, PREFIX.png."""
    Path(prefix + ".json").write_text(json.dumps(rows, indent=1) + "\n")
    Path(prefix + ".md").write_text(table(rows, title) + extra)
    if not png:
        return
    try:
        plot(rows, prefix + ".png", title)
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[bench]')", file=sys.stderr)


def build_runner(store: Path | None):
    """A runner of the bundled flux-shapes: compiled through STORE, or eager when STORE is None."""
    from difflet.runtime import demo
    from difflet.runtime.runner import ModelRunner

    demo.quiet_libraries()
    if store is None:
        from difflet.codegen.artifacts import eager_programs
        from difflet.frontend.lower import lower_file
        from difflet.passes.pipeline import optimize

        dsl, weights = demo.MODELS["flux-shapes"]
        module = optimize(lower_file(str(dsl)), parallel="tp1", target="cpu", backend="inductor")
        return ModelRunner(module, eager_programs(module, weights), weights)
    art = Path(tempfile.mkdtemp(prefix="caching-quality-")) / "art"
    demo.compile_model("flux-shapes", art, store)
    return ModelRunner.from_artifacts(art)


def keep_pair(text: str) -> tuple[int, int]:
    try:
        initial, final = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--keep takes INITIAL,FINAL (two integers), got {text!r}") from None
    if initial < 2 or final < 0:
        raise argparse.ArgumentTypeError("--keep: INITIAL >= 2 (a change needs two computed steps), FINAL >= 0")
    return initial, final


def main(argv=None) -> int:
    from difflet.codegen.store import default_store_dir
    from difflet.train import DEFAULT_STEPS
    from difflet.train.shapes_data import CAPTIONS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--captions", type=int, default=len(CAPTIONS), help="the first N captions")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    ap.add_argument("--keep", type=keep_pair, action="append", default=[],
                    help="also every caching mode with these kept steps, as INITIAL,FINAL")
    ap.add_argument("--store", type=Path, default=None, help="program store (default: the user's)")
    ap.add_argument("--eager", action="store_true", help="uncompiled programs (no compile)")
    ap.add_argument("--out", default=None, help="write PREFIX.json, PREFIX.md and PREFIX.png")
    ap.add_argument("--replot", default=None, metavar="PREFIX", help="redraw PREFIX.md/.png from PREFIX.json")
    args = ap.parse_args(argv)
    if args.replot:
        rows = json.loads(Path(args.replot + ".json").read_text())
        md = Path(args.replot + ".md")
        write(rows, args.replot, md.read_text().splitlines()[0] if md.is_file() else "")
        return 0
    if not 1 <= args.captions <= len(CAPTIONS):
        ap.error(f"--captions must be in [1, {len(CAPTIONS)}]")
    if not 12 <= args.steps <= 1000:
        ap.error("--steps must be in [12, 1000] (5 + 5 kept steps and a window)")
    torch.set_num_threads(1)
    jobs = [(c, s) for c in CAPTIONS[:args.captions] for s in args.seeds]
    if args.eager and args.store:
        ap.error("--eager compiles nothing: drop --store")
    runner = build_runner(None if args.eager else args.store or default_store_dir())
    try:
        rows = sweep(runner, jobs, args.steps, settings([(5, 5), *args.keep]),
                     log=lambda line: print(line, flush=True))
    finally:
        runner.close()
    title = (f"flux-shapes, {args.steps} steps, {len(jobs)} images ({args.captions} captions x seeds "
             f"{' '.join(map(str, args.seeds))}); PSNR against the uncached {args.steps}-step image")
    print(table(rows, title))
    if args.out:
        write(rows, args.out, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
