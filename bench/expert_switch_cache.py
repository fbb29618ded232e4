"""Step caching across Wan 2.2's expert switch: restart the cache at the switch (what Difflet
does) or keep one history across it (the alternative), each against the uncached video.

models/wan2.2-tiny.dsl (two independent random experts: the worst case for crossing, real
experts share a base model) through Difflet's runner (tp1, cpu, inductor), per mode and step
count over `--seeds`: PSNR (dB, 8-bit frames) of the cached video against the uncached one of the
same seed (null / "identical" where equal), and the cached-step schedule (F full, C cached) of the first seed. "one history" is
the same run with StepCache.restart made a no-op.

    python bench/expert_switch_cache.py [--seeds 4] [--out bench/results/expert_switch_cache]
--out PREFIX writes PREFIX.json (rows {steps, mode, restart_psnr, one_history_psnr,
restart_schedule, one_history_schedule}) and PREFIX.md (the table).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
MODES = ("cadence:2", "cadence:3", "online-delta:1.0")


def measure(seeds: int, work: Path) -> list[dict]:
    from oracle_util import compile_art, planned_tiny, psnr, random_checkpoint

    import difflet.stepcache.controller as controller
    from difflet.runtime.runner import ModelRunner

    module = planned_tiny(REPO / "models" / "wan2.2-tiny.dsl")
    art = compile_art(module, random_checkpoint(module), work / "art")
    restart, rows = controller.StepCache.restart, []
    with ModelRunner.from_artifacts(art) as runner:
        def run(seed, steps, cache=""):
            return runner.generate(runner.resolve(prompt="a red fox in the snow", seed=seed, steps=steps, cache=cache))

        for steps in (16, 24):
            for mode in MODES:
                got = {"restart": [], "one_history": []}
                schedules = {}
                for seed in range(seeds):
                    base = run(seed, steps).video
                    for how in got:
                        controller.StepCache.restart = restart if how == "restart" else (lambda self: None)
                        try:
                            out = run(seed, steps, mode)
                        finally:
                            controller.StepCache.restart = restart
                        got[how].append(psnr(base, out.video))
                        schedules.setdefault(how, out.stats["schedule"])
                rows.append({"steps": steps, "mode": mode, **{f"{h}_psnr": _finite(statistics.mean(v)) for h, v in got.items()},
                             **{f"{h}_schedule": s for h, s in schedules.items()}})
    return rows


def _finite(db: float) -> float | None:
    """PSNR for JSON: None where every frame is identical (infinite)."""
    return None if db == float("inf") else db


def _db(db: float | None) -> str:
    return "identical" if db is None else f"{db:.1f}"


def table(rows: list[dict]) -> str:
    out = ["| steps | mode | restart at the switch: PSNR dB (schedule) | one history: PSNR dB (schedule) |",
           "|---:|---|---|---|"]
    for r in rows:
        out.append(f"| {r['steps']} | {r['mode']} | {_db(r['restart_psnr'])} (`{r['restart_schedule']}`) | "
                   f"{_db(r['one_history_psnr'])} (`{r['one_history_schedule']}`) |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    with tempfile.TemporaryDirectory() as work:
        rows = measure(args.seeds, Path(work))
    print(json.dumps(rows, indent=2))
    print(table(rows))
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps(rows, indent=2) + "\n")
        Path(f"{args.out}.md").write_text("Step cache across Wan 2.2's expert switch (wan2.2-tiny, "
                                          f"{args.seeds} seeds)\n\n{table(rows)}\n")


if __name__ == "__main__":
    main()
