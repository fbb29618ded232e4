"""Prompt following of the flux-shapes model: every caption x 2 seeds through diffusers FluxPipeline.

`python bench/prompt_following.py [--model DIR] [--steps N] [--true-cfg S]` prints one JSON line
(accuracies and counts) and a markdown table (overall and per shape / colour). Each generated
image is judged by difflet.train.checker (plain image analysis, ~100% on ground-truth images).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

import torch


def main(argv=None) -> int:
    from difflet.train import ASSET_DIR, DEFAULT_STEPS, generate, load_pipeline
    from difflet.train.checker import check
    from difflet.train.shapes_data import CAPTIONS, caption

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ASSET_DIR))
    ap.add_argument("--steps", type=int, default=None, help=f"default: the pipeline's ({DEFAULT_STEPS})")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--true-cfg", type=float, default=1.0)
    ap.add_argument("--save-grid", default=None, help="write all images to this PNG")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    pipe = load_pipeline(args.model)
    jobs = [(c, s) for c in CAPTIONS for s in args.seeds]
    t0 = time.time()
    images = generate(pipe, [caption(*c) for c, _ in jobs], [s for _, s in jobs], args.steps, args.true_cfg)
    secs = time.time() - t0
    hits, groups = defaultdict(int), defaultdict(lambda: defaultdict(int))
    for (c, _), img in zip(jobs, images):
        r = check(img, *c)
        r["all"] = all(r.values())
        for k, v in r.items():
            hits[k] += v
            for g in (f"shape={c[0]}", f"fg={c[1]}", f"bg={c[2]}"):
                groups[g][k] += v
                groups[g]["n"] += k == "all"
    n = len(jobs)
    res = {"model": args.model, "images": n, "steps": args.steps or DEFAULT_STEPS,
           "true_cfg": args.true_cfg, "seeds": args.seeds, "seconds": round(secs, 1),
           **{f"{k}_acc": round(hits[k] / n, 4) for k in ("fg", "bg", "shape", "all")}}
    print(json.dumps(res))
    print("\n| group | n | shape colour | background | shape | all three |\n|---|---|---|---|---|---|")
    print(f"| all | {n} | " + " | ".join(f"{100 * hits[k] / n:.1f}%" for k in ("fg", "bg", "shape", "all")) + " |")
    for g in sorted(groups):
        d = groups[g]
        print(f"| {g} | {d['n']} | " + " | ".join(f"{100 * d[k] / d['n']:.1f}%" for k in ("fg", "bg", "shape", "all")) + " |")
    if args.save_grid:
        import numpy as np
        from PIL import Image

        cols = 2 * len(args.seeds) * 3
        rows = [np.concatenate(list(images[i:i + cols]), 1) for i in range(0, n - n % cols, cols)]
        Image.fromarray(np.concatenate(rows, 0)).save(args.save_grid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
