"""Cold codegen of a demo model: programs compiled one by one vs concurrently, back to back.

Each run lowers, optimizes (tp1, cpu, inductor) and codegens the model (`difflet demo`'s
compile_model) into an empty program store with an empty TorchInductor cache, in a fresh
process, so every program (and inductor's one-off CPU ISA probe) is compiled. Runs:
  sequential   DIFFLET_COMPILE_WORKERS=1 (what codegen did before the compile pool)
  concurrent   the default worker count (min(cores, programs, memory / estimate))
alternating `--repeats` times. Reports each run's codegen seconds and the load average before
it (the machine may be shared; compare runs taken back to back), each program's seconds, and
the CPU time of the run's processes (RUSAGE_CHILDREN: the compile workers and g++ included; on a
saturated machine wall time says little, CPU time says what concurrency costs). Prints JSON
(also to --json), then a markdown table.

    python bench/cold_codegen.py [--model flux-shapes] [--repeats 1] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

RUN = """
import json, sys, time
from pathlib import Path
from difflet.runtime.demo import DemoReport, compile_model
report = DemoReport()
result = compile_model(sys.argv[1], Path(sys.argv[2]) / "art", Path(sys.argv[2]) / "store", report)
print(json.dumps({"stages": {name: [secs, note] for name, secs, note in report.stages},
                  "programs": {k: round(v, 1) for k, v in result.seconds.items()}}))
"""


def one_run(model: str, workers: str | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor")}
        env.pop("DIFFLET_COMPILE_WORKERS", None)
        if workers is not None:
            env["DIFFLET_COMPILE_WORKERS"] = workers
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([sys.executable, "-c", RUN, model, tmp], env=env, capture_output=True, text=True,
                             check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        got = json.loads(out.stdout.strip().splitlines()[-1])
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"codegen_s": round(got["stages"]["codegen"][0], 1), "note": got["stages"]["codegen"][1],
            "programs_s": got["programs"], "cpu_s": round(cpu, 1), "load_before": load}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="flux-shapes")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    runs = []
    for _ in range(args.repeats):
        for mode, workers in (("sequential", "1"), ("concurrent", None)):
            runs.append({"mode": mode, **one_run(args.model, workers)})
    result = {"model": args.model, "cores": len(os.sched_getaffinity(0)), "runs": runs}
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    print(f"\ncold codegen of {args.model} on {result['cores']} cores\n")
    print("| run | codegen | CPU time (all processes) | load average before |\n|---|---:|---:|---:|")
    for r in runs:
        print(f"| {r['mode']} | {r['codegen_s']:.1f} s ({r['note']}) | {r['cpu_s']:.1f} s | {r['load_before']:.1f} |")


if __name__ == "__main__":
    main()
