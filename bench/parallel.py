"""Benchmark distributed joint attention: K/V bytes per rank, mode times on gloo ranks, and
bounded attention vs dense-mask SDPA; and whole denoiser step time per parallel configuration
per family (each family's tiny description, split by codegen's split_layout, eager) as a ratio to
TP1; and a true-CFG step (both guidance passes) of qwen-image-tiny under a cfg2 layout vs
sequential CFG on the same number of ranks (bench/parallel_cfg.py). Prints JSON, then markdown
tables. Never a test.

K/V bytes are what each mode's kernel calls actually hold at once (the `report` the joint
attention functions fill from their tensors), measured on real gloo ranks at each CP size.
Times are wall-clock on this host's CPU over gloo loopback: read them as ratios within one run.

  python bench/parallel.py            # default sizes (about a minute on 2 idle cores)
  python bench/parallel.py --quick    # smaller sizes
  python bench/parallel.py --steps    # only the denoiser step table (--models a,b: some families)
  python bench/parallel.py --cfg      # only the CFG-parallel vs sequential CFG table
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from difflet.parallel.launch import run_ranks
from parallel_cfg import bench_cfg  # bench/ is on sys.path when run as a script

MODES = ("gather_kv", "ulysses", "ring")


def _inputs(h, v, t, d, cp, cp_i):
    g = torch.Generator().manual_seed(0)
    vis = [torch.randn(1, h, v, d, generator=g)[:, :, cp_i * v // cp:(cp_i + 1) * v // cp] for _ in range(3)]
    txt = [torch.randn(1, h, t, d, generator=g) for _ in range(3)]
    return vis, txt


def _rank_memory(rank, world, h, t, d, seqs):
    """kv_bytes per mode and visual length, on this rank (one call each)."""
    from difflet.parallel.joint_attention import joint_attention

    out = {}
    for v in seqs:
        vis, txt = _inputs(h, v, t, d, world, rank)
        for mode in MODES:
            rep = {}
            joint_attention(mode, *vis, *txt, torch.tensor(t // 2), _world(), rep)
            out[mode, v] = rep["kv_bytes"]
    return out


def _world():
    import torch.distributed as dist
    return dist.group.WORLD


def _rank_times(rank, world, h, t, d, seqs, reps):
    """Per mode and visual length: this rank's seconds per call for each rep (after a barrier)."""
    import torch.distributed as dist
    from difflet.parallel.joint_attention import joint_attention

    out = {}
    for v in seqs:
        vis, txt = _inputs(h, v, t, d, world, rank)
        for mode in MODES:
            joint_attention(mode, *vis, *txt, torch.tensor(t // 2), _world())  # warm-up
            times = []
            for _ in range(reps):
                dist.barrier()
                t0 = time.perf_counter()
                joint_attention(mode, *vis, *txt, torch.tensor(t // 2), _world())
                times.append(time.perf_counter() - t0)
            out[mode, v] = times
    return out


def bench_memory(cps, h, t, d, seqs):
    rows = []
    for cp in cps:
        per_rank = run_ranks(_rank_memory, cp, h, t, d, seqs, timeout=600)
        for v in seqs:
            row = {"cp": cp, "visual": v, "text": t, "heads": h, "head_dim": d}
            for mode in MODES:
                row[f"{mode}_kv_bytes"] = max(r[mode, v] for r in per_rank)
            rows.append(row)
    return rows


def bench_times(world, h, t, d, seqs, reps):
    per_rank = run_ranks(_rank_times, world, h, t, d, seqs, reps, timeout=600)
    rows = []
    for v in seqs:
        row = {"cp": world, "visual": v, "text": t, "heads": h, "head_dim": d}
        for mode in MODES:
            # a call takes as long as its slowest rank; median over reps
            row[f"{mode}_ms"] = 1e3 * statistics.median(max(r[mode, v][i] for r in per_rank) for i in range(reps))
        rows.append(row)
    return rows


def bench_mask(h, t, d, seqs, reps):
    from difflet.kernels.attention_ref import bounded_attention

    rows = []
    for v in seqs:
        s, valid = v + t, t // 2
        g = torch.Generator().manual_seed(1)
        q, k, kk = (torch.randn(1, h, s, d, generator=g) for _ in range(3))
        keep = torch.ones(s, dtype=torch.bool)
        keep[v + valid:] = False  # keys [visual, valid text, padding]
        mask = keep.expand(s, s)
        lo, hi = torch.tensor(0), torch.tensor(v + valid)

        def timed(fn):
            fn()
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return 1e3 * statistics.median(ts)
        bounded_ms = timed(lambda: bounded_attention(q, k, kk, lo, hi))
        sdpa_ms = timed(lambda: F.scaled_dot_product_attention(q, k, kk, attn_mask=mask))
        err = (bounded_attention(q, k, kk, lo, hi) - F.scaled_dot_product_attention(q, k, kk, attn_mask=mask)).abs().max().item()
        rows.append({"seq": s, "heads": h, "head_dim": d, "bounded_ms": bounded_ms, "sdpa_mask_ms": sdpa_ms,
                     "mask_bytes": mask.numel() * mask.element_size(), "bounds_bytes": 16, "max_abs_diff": err})
    return rows


STEP_CONFIGS = [("tp1", None, 1), ("tp2", None, 2), ("tp1cp2", "ulysses", 2), ("tp1cp2", "ring", 2),
                ("tp4", None, 4), ("tp4+sp", None, 4), ("tp2cp2", "ulysses", 4), ("tp2cp2", "ring", 4),
                ("tp2cp2", "gather_kv", 4), ("tp1cp4", "ulysses", 4), ("tp1cp4", "ring", 4)]
# one tiny description per family (4 heads where the family has one, so tp4 / Ulysses at 4 ranks
# are legal) and its profile overrides: a larger visual sequence than the tests use
STEP_MODELS = {"flux-tiny4": "side", "qwen-image-tiny": {}, "wan2.1-tiny4": {},
               "hunyuan-video-tiny4": {}, "ltx2-tiny4": {}}


def _plan(model, parallel, attention, overrides):
    from pathlib import Path

    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    dsl = Path(__file__).resolve().parent.parent / "models" / f"{model}.dsl"
    return optimize(lower_file(str(dsl), overrides), parallel=parallel, attention=attention, target="cpu")


def _buildable(model, overrides):
    """STEP_CONFIGS the planner calls legal on cpu and codegen builds, for this model."""
    from difflet.errors import DiffletError
    from difflet.passes.built import reasons

    out = []
    for p, a, w in STEP_CONFIGS:
        try:
            planned = _plan(model, p, a, overrides)
        except DiffletError:
            continue  # illegal here (heads, tokens): the planner's verdict
        if not reasons(planned):
            out.append((p, a, w))
    return out


def _rank_steps(rank, world, model, configs, ckpt, overrides, reps):
    """Per config: this rank's seconds per denoiser call for each rep (after a barrier)."""
    import torch.distributed as dist
    from difflet.codegen.build import example_inputs
    from difflet.codegen.split_codegen import degrees
    from difflet.codegen.split_layout import build_rank_module
    from difflet.parallel.groups import make_groups

    out = {}
    for parallel, attention in configs:
        node = _plan(model, parallel, attention, overrides).components("denoiser")[0]
        pm = build_rank_module(node, ckpt, make_groups(degrees(node)))
        x = example_inputs(node)
        with torch.no_grad():
            pm(*x)  # warm-up
            times = []
            for _ in range(reps):
                dist.barrier()
                t0 = time.perf_counter()
                pm(*x)
                times.append(time.perf_counter() - t0)
        out[parallel, attention] = times
    return out


def bench_steps(side, reps, models=tuple(STEP_MODELS)):
    """Per family: denoiser call ms per buildable configuration (slowest rank, median) and its
    ratio to TP1, one run."""
    import tempfile

    from difflet.codegen.checkpoint import resolve_weights
    from difflet.passes import model_facts as F

    store = tempfile.mkdtemp(prefix="difflet-bench-")
    rows = []
    for model in models:
        overrides = {"height": str(side), "width": str(side)} if STEP_MODELS[model] == "side" else STEP_MODELS[model]
        base_plan = _plan(model, "tp1", None, overrides)
        ckpt = str(resolve_weights(base_plan, "random:0", store))
        tokens = F.tokens(base_plan.components("denoiser")[0])
        buildable = _buildable(model, overrides)
        model_rows = []
        for world in (1, 2, 4):
            configs = [(p, a) for p, a, w in buildable if w == world]
            if not configs:
                continue
            per_rank = run_ranks(_rank_steps, world, model, configs, ckpt, overrides, reps, timeout=1800)
            for p, a in configs:
                ms = 1e3 * statistics.median(max(r[p, a][i] for r in per_rank) for i in range(reps))
                model_rows.append({"model": model, "visual": tokens["visual"], "text": tokens["text"],
                                   "config": p, "attention": a or "-", "ranks": world, "step_ms": ms})
        base = next(r["step_ms"] for r in model_rows if r["config"] == "tp1")
        for r in model_rows:
            r["ratio_to_tp1"] = r["step_ms"] / base
        rows += model_rows
    return {"rows": rows}


def _table(rows, cols):
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols)
    fmt = lambda x: f"{x:.3g}" if isinstance(x, float) else str(x)  # noqa: E731
    return head + "\n" + "\n".join("| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    ap.add_argument("--steps", action="store_true", help="only the denoiser step time per configuration")
    ap.add_argument("--models", default=",".join(STEP_MODELS),
                    help=f"families' tiny descriptions for the step table (default: {','.join(STEP_MODELS)})")
    ap.add_argument("--out", help="with --steps: also write the step table to OUT.json and OUT.md")
    ap.add_argument("--cfg", action="store_true", help="only the CFG-parallel vs sequential CFG step time")
    a = ap.parse_args(argv)
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    unknown = sorted(set(models) - set(STEP_MODELS))
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)} (known: {', '.join(STEP_MODELS)})")
    torch.set_num_threads(1)
    if a.cfg:
        cfg = bench_cfg(128 if a.quick else 256, 3 if a.quick else 5)
        print(json.dumps(cfg, indent=1))
        _print_cfg(cfg)
        return
    steps = bench_steps(64 if a.quick else 128, 3 if a.quick else 5, models)
    if a.steps:
        print(json.dumps(steps, indent=1))
        _print_steps(steps)
        if a.out:
            Path(a.out + ".json").write_text(json.dumps(steps, indent=1) + "\n")
            Path(a.out + ".md").write_text(_steps_md(steps) + "\n")
        return
    h, d = 8, 64
    mem_seqs, t_mem = ((512, 2048) if a.quick else (1024, 2048, 4096)), 256
    time_seqs, t_time = ((256,) if a.quick else (256, 1024)), 64
    mask_seqs = (448, 960) if a.quick else (448, 960, 1984, 3968)
    torch.set_num_threads(1)
    result = {"memory": bench_memory((2, 4), 4, t_mem, d, mem_seqs),
              "times_4_ranks": bench_times(4, h, t_time, d, time_seqs, 3 if a.quick else 5),
              "mask": bench_mask(h, 64, d, mask_seqs, 3 if a.quick else 5),
              "steps": steps, "cfg": bench_cfg(128 if a.quick else 256, 3 if a.quick else 5),
              "torch": torch.__version__, "threads_per_rank": 1}
    for r in result["memory"]:
        r["gather_kv/ulysses"] = r["gather_kv_kv_bytes"] / r["ulysses_kv_bytes"]
        r["gather_kv/ring"] = r["gather_kv_kv_bytes"] / r["ring_kv_bytes"]
    for r in result["mask"]:
        r["sdpa/bounded"] = r["sdpa_mask_ms"] / r["bounded_ms"]
    print(json.dumps(result, indent=1))
    print("\n### K/V bytes per rank held for attention (measured, fp32, local heads 4, head_dim 64)\n")
    print(_table(result["memory"], ["cp", "visual", "text", "gather_kv_kv_bytes", "ulysses_kv_bytes",
                                    "ring_kv_bytes", "gather_kv/ulysses", "gather_kv/ring"]))
    print("\n### Joint attention time on 4 gloo ranks (ms, median of slowest rank)\n")
    print(_table(result["times_4_ranks"], ["cp", "visual", "text", "gather_kv_ms", "ulysses_ms", "ring_ms"]))
    print("\n### Bounded attention vs dense-mask SDPA (single process, 1 thread)\n")
    print(_table(result["mask"], ["seq", "bounded_ms", "sdpa_mask_ms", "sdpa/bounded", "mask_bytes",
                                  "bounds_bytes", "max_abs_diff"]))
    _print_steps(steps)
    _print_cfg(result["cfg"])


def _print_cfg(cfg):
    print(f"\n### True-CFG step, cfg2 layout vs sequential CFG on as many ranks ({cfg['model']}, "
          f"{cfg['visual_tokens']} visual + {cfg['text_tokens']} text tokens, eager, 1 thread per rank)\n")
    print(_table(cfg["rows"], ["ranks", "cfg_layout", "cfg_step_ms", "sequential_layout", "sequential_step_ms",
                               "cfg/sequential", "tp1_step_ms", "cfg/tp1", "sequential/tp1"]))


def _steps_md(steps) -> str:
    return ("### Denoiser call per configuration and family (random:0 tiny models, eager split rank "
            "modules, 1 thread per rank; every configuration the planner calls legal on cpu and codegen "
            "builds)\n\n" + _table(steps["rows"], ["model", "visual", "text", "config", "attention", "ranks",
                                                 "step_ms", "ratio_to_tp1"]))


def _print_steps(steps):
    print("\n" + _steps_md(steps))


if __name__ == "__main__":
    main()
