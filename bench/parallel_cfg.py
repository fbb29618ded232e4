"""The true-CFG step of bench/parallel.py: qwen-image-tiny's two guidance passes per step under a
cfg2 layout (codegen's cfg rank modules, one call: each cfg group runs one pass) vs sequential
CFG (two calls of the split program) on the same number of gloo ranks. Eager modules, 1 thread
per rank; times are the slowest rank's, median over reps. Run through `python bench/parallel.py
--cfg`; never a test.
"""
from __future__ import annotations

import statistics
import time

import torch

from difflet.parallel.launch import run_ranks

# (cfg layout, sequential layout on as many ranks): both passes per step, each way
CFG_PAIRS = [("tp1+cfg2", "tp2", 2), ("tp2+cfg2", "tp4", 4)]


def _plan_qwen(parallel, side):
    from pathlib import Path

    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    dsl = Path(__file__).resolve().parent.parent / "models" / "qwen-image-tiny.dsl"
    return optimize(lower_file(str(dsl), {"height": str(side), "width": str(side)}), parallel=parallel,
                    target="cpu")


def _rank_cfg_steps(rank, world, configs, ckpt, side, reps):
    """Per config: this rank's seconds per true-CFG step (one cfg call, or two sequential calls)."""
    import torch.distributed as dist
    from difflet.codegen.build import example_inputs
    from difflet.codegen.split_codegen import degrees, rank_module
    from difflet.parallel.groups import make_groups

    out = {}
    for parallel in configs:
        node = _plan_qwen(parallel, side).component("transformer")
        pm = rank_module(node, ckpt, make_groups(degrees(node)))
        x = example_inputs(node)  # a cfg node's inputs include the unconditional twins
        calls = [x] if "cfg" in parallel else [x, (x[0], x[1].flip(1), x[2], x[3])]
        with torch.no_grad():
            for c in calls:
                pm(*c)  # warm-up
            times = []
            for _ in range(reps):
                dist.barrier()
                t0 = time.perf_counter()
                for c in calls:
                    pm(*c)
                times.append(time.perf_counter() - t0)
        out[parallel] = times
    return out


def bench_cfg(side, reps):
    """True-CFG step ms (slowest rank, median): cfg2 layout vs sequential CFG at equal ranks."""
    import tempfile

    from difflet.codegen.checkpoint import resolve_weights

    store = tempfile.mkdtemp(prefix="difflet-bench-")
    ckpt = str(resolve_weights(_plan_qwen("tp1", side), "random:0", store))
    one = run_ranks(_rank_cfg_steps, 1, ("tp1",), ckpt, side, reps, timeout=1200)[0]["tp1"]
    tp1_ms = 1e3 * statistics.median(one)  # sequential CFG on one rank: what both layouts divide
    rows = []
    for cfg, seq, world in CFG_PAIRS:
        per_rank = run_ranks(_rank_cfg_steps, world, (seq, cfg), ckpt, side, reps, timeout=1200)
        ms = {p: 1e3 * statistics.median(max(r[p][i] for r in per_rank) for i in range(reps)) for p in (seq, cfg)}
        rows.append({"ranks": world, "cfg_layout": cfg, "cfg_step_ms": ms[cfg], "sequential_layout": seq,
                     "sequential_step_ms": ms[seq], "cfg/sequential": ms[cfg] / ms[seq],
                     "tp1_step_ms": tp1_ms, "cfg/tp1": ms[cfg] / tp1_ms, "sequential/tp1": ms[seq] / tp1_ms})
    return {"model": "qwen-image-tiny", "height": side, "width": side, "visual_tokens": (side // 8) ** 2,
            "text_tokens": 16, "rows": rows}
