"""The true-CFG step of bench/parallel.py: qwen-image-tiny's two guidance passes per step under a
cfg2 layout (the runtime's CfgProgram, one call: two replicas of the inner program, one pass
each, at once) vs sequential CFG (two calls of the split program) on the same number of gloo
ranks. Eager rank modules in resident workers, 1 thread per rank; times are host wall time per
step (inputs sent, outputs back), median over reps. Run through `python bench/parallel.py
--cfg`; never a test.
"""
from __future__ import annotations

import statistics
import time

# (cfg layout, sequential layout on as many ranks): both passes per step, each way
CFG_PAIRS = [("tp1+cfg2", "tp2", 2), ("tp2+cfg2", "tp4", 4)]


def _plan_qwen(parallel, side):
    from pathlib import Path

    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    dsl = Path(__file__).resolve().parent.parent / "models" / "qwen-image-tiny.dsl"
    return optimize(lower_file(str(dsl), {"height": str(side), "width": str(side)}), parallel=parallel,
                    target="cpu")


def _step_seconds(parallel, ckpt, side, reps):
    """Seconds per true-CFG step (median) of `parallel`'s eager program, timed on the host: a cfg
    layout's CfgProgram in one call (both groups at once), any other layout's SplitProgram twice."""
    from difflet.codegen.build import example_inputs
    from difflet.codegen.cfg_program import eager_cfg_program
    from difflet.codegen.split_codegen import eager_split_program

    module = _plan_qwen(parallel, side)
    node = module.component("transformer")
    x = example_inputs(node)  # a cfg node's inputs include the unconditional twins
    cfg = "cfg" in parallel
    calls = [x] if cfg else [x, (x[0], x[1].flip(1), x[2], x[3])]
    start = eager_cfg_program if cfg else eager_split_program
    with start(module, node, ckpt, timeout=1200) as prog:
        for c in calls:
            prog(*c)  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for c in calls:
                prog(*c)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_cfg(side, reps):
    """True-CFG step ms (host wall time, median): cfg2 layout vs sequential CFG at equal ranks."""
    import tempfile

    from difflet.codegen.checkpoint import resolve_weights

    store = tempfile.mkdtemp(prefix="difflet-bench-")
    ckpt = str(resolve_weights(_plan_qwen("tp1", side), "random:0", store))
    tp1_ms = 1e3 * _step_seconds("tp1", ckpt, side, reps)  # sequential CFG on one rank: what both layouts divide
    rows = []
    for cfg, seq, world in CFG_PAIRS:
        ms = {p: 1e3 * _step_seconds(p, ckpt, side, reps) for p in (seq, cfg)}
        rows.append({"ranks": world, "cfg_layout": cfg, "cfg_step_ms": ms[cfg], "sequential_layout": seq,
                     "sequential_step_ms": ms[seq], "cfg/sequential": ms[cfg] / ms[seq],
                     "tp1_step_ms": tp1_ms, "cfg/tp1": ms[cfg] / tp1_ms, "sequential/tp1": ms[seq] / tp1_ms})
    return {"model": "qwen-image-tiny", "height": side, "width": side, "visual_tokens": (side // 8) ** 2,
            "text_tokens": 16, "rows": rows}
