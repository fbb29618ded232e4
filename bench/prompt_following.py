"""Prompt following of the flux-shapes model: every caption x 2 seeds through diffusers FluxPipeline
and, with --difflet, through Difflet's own served pipeline on the same weights.

`python bench/prompt_following.py [--model DIR] [--steps N] [--true-cfg S] [--difflet]` prints
one JSON line per pipeline (accuracies and counts) and a markdown table (overall and per shape /
colour; with --difflet one column group per pipeline plus how many images are pixel-identical).
Each generated image is judged by difflet.train.checker (plain image analysis, ~100% on
ground-truth images).

--difflet compiles models/flux-shapes.dsl (tp1, cpu, inductor) against --model's weights into a
temporary ART dir (programs from --store) and runs every job through
ModelRunner.from_artifacts: the code path difflet-runtime serves with. It has no true CFG.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

KEYS = ("fg", "bg", "shape", "all")


def score(images, jobs) -> tuple[dict, dict]:
    """(hits per key, {group: hits per key + "n"}) of the checker over images[i] for jobs[i]."""
    from difflet.train.checker import check

    hits, groups = defaultdict(int), defaultdict(lambda: defaultdict(int))
    for (c, _), img in zip(jobs, images):
        r = check(img, *c)
        r["all"] = all(r.values())
        for k, v in r.items():
            hits[k] += v
            for g in (f"shape={c[0]}", f"fg={c[1]}", f"bg={c[2]}"):
                groups[g][k] += v
                groups[g]["n"] += k == "all"
    return hits, groups


def difflet_images(weights: str, jobs, prompts, steps: int | None, store: str | None):
    """uint8 [n, 32, 32, 3] from Difflet's compiled flux-shapes pipeline on WEIGHTS."""
    from difflet.codegen.store import default_store_dir
    from difflet.runtime import demo
    from difflet.runtime.runner import ModelRunner

    demo.quiet_libraries()
    dsl, _ = demo.MODELS["flux-shapes"]
    demo.MODELS["bench"] = (dsl, weights)  # this process only: the demo's pairing, other weights
    with tempfile.TemporaryDirectory() as tmp:
        art = Path(tmp) / "art"
        demo.compile_model("bench", art, Path(store) if store else default_store_dir())
        runner = ModelRunner.from_artifacts(art)
        try:  # resolve = the server's validation; unset fields take the profile's values
            out = [runner.generate(runner.resolve(prompt=p, seed=s, steps=steps)).image
                   for p, (_, s) in zip(prompts, jobs)]
        finally:
            runner.close()
    return np.stack(out)


def main(argv=None) -> int:
    from difflet.train import ASSET_DIR, DEFAULT_STEPS, generate, load_pipeline
    from difflet.train.shapes_data import CAPTIONS, caption

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ASSET_DIR))
    ap.add_argument("--steps", type=int, default=None, help=f"default: the pipeline's ({DEFAULT_STEPS})")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--true-cfg", type=float, default=1.0)
    ap.add_argument("--difflet", action="store_true",
                    help="also run Difflet's compiled pipeline (models/flux-shapes.dsl) on --model")
    ap.add_argument("--store", default=None, help="program store for --difflet (default: the user's)")
    ap.add_argument("--save-grid", default=None, help="write all (FluxPipeline) images to this PNG")
    args = ap.parse_args(argv)
    if args.difflet and args.true_cfg != 1.0:
        ap.error("--difflet runs without true CFG (guidance mode none); drop --true-cfg")
    torch.set_num_threads(1)
    jobs = [(c, s) for c in CAPTIONS for s in args.seeds]
    prompts = [caption(*c) for c, _ in jobs]
    runs = {}
    t0 = time.time()
    runs["FluxPipeline"] = (generate(load_pipeline(args.model), prompts, [s for _, s in jobs],
                                     args.steps, args.true_cfg), time.time() - t0)
    if args.difflet:
        t0 = time.time()
        runs["Difflet"] = (difflet_images(args.model, jobs, prompts, args.steps, args.store),
                           time.time() - t0)
    n = len(jobs)
    scored = {}
    for name, (images, secs) in runs.items():
        hits, groups = scored[name] = score(images, jobs)
        print(json.dumps({"pipeline": name, "model": args.model, "images": n,
                          "steps": args.steps or DEFAULT_STEPS, "true_cfg": args.true_cfg,
                          "seeds": args.seeds, "seconds": round(secs, 1),
                          **{f"{k}_acc": round(hits[k] / n, 4) for k in KEYS}}))
    if args.difflet:
        a, b = runs["FluxPipeline"][0].astype(int), runs["Difflet"][0].astype(int)
        same = int(sum(np.array_equal(x, y) for x, y in zip(a, b)))
        mse = np.array([np.mean((x - y) ** 2) for x, y in zip(a, b)])
        worst = 10 * np.log10(255.0 ** 2 / mse.max()) if mse.max() else float("inf")
        print(f"Difflet vs FluxPipeline: identical images {same}/{n}, max |pixel diff| "
              f"{int(np.abs(a - b).max())}, lowest PSNR {worst:.1f} dB")
    heads = " | ".join(f"{name}: {h}" for name in scored
                       for h in ("shape colour", "background", "shape", "all three"))
    print(f"\n| group | n | {heads} |\n|" + "---|" * (2 + 4 * len(scored)))

    def row(label, count, get):
        cells = " | ".join(f"{100 * get(name, k) / count:.1f}%" for name in scored for k in KEYS)
        print(f"| {label} | {count} | {cells} |")

    row("all", n, lambda name, k: scored[name][0][k])
    for g in sorted(scored["FluxPipeline"][1]):
        row(g, scored["FluxPipeline"][1][g]["n"], lambda name, k: scored[name][1][g][k])
    if args.save_grid:
        from PIL import Image

        images = runs["FluxPipeline"][0]
        cols = 2 * len(args.seeds) * 3
        rows = [np.concatenate(list(images[i:i + cols]), 1) for i in range(0, n - n % cols, cols)]
        Image.fromarray(np.concatenate(rows, 0)).save(args.save_grid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
