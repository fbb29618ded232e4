"""A real-size Wan2.1-T2V-1.3B request through Difflet, against WanPipeline from the same checkpoint
(issue 34). The checkpoint: bench/real_size_checkpoint.py (random bf16 weights of the published
architecture; its creation is not measured here).

Stages, each a fresh subprocess whose process tree's RSS is sampled every 0.2 s (peak = the
largest sum over the tree, codegen's compile workers included):
  lower     `difflet lower models/wan2.1.dsl --weights CKPT --profile ...` + `difflet opt`
  codegen   `difflet codegen` into an empty store (cold; per program: seconds), then again into a
            second artifact on the same store (warm: must compile nothing)
  serve     the model process's code (ModelRunner over the artifact): load, warm-up generation,
            then one request (prompt, seed 0, CFG on): encode, each denoising step, decode
  runtime   difflet-runtime on the artifact as a user starts it (API process + model process):
            start until serving, the same request over gRPC (lossless video); the model
            process's peak RSS apart from the API process's
  pipeline  WanPipeline.from_pretrained(CKPT) (bf16, the VAE fp32 as Wan's docs load it): load,
            the same request (each step timed by callback_on_step_end), decode; then the
            diffusers modules on the inputs Difflet's programs were given (per-program cos)
  floor     WanPipeline again with SDPA's math kernel instead of the fused one: how far two valid
            bf16 evaluations of this random-weight model drift apart (the end-to-end PSNR's floor)
Reports JSON (bench/results/real_size.json) and a markdown table (bench/results/real_size.md):
cold/warm seconds and peak RSS per stage; Difflet / WanPipeline ratios, each only when both its
stages ran in this invocation: `peak_rss_ratio` and `step_time_ratio` (the serve stage's runner,
median denoising step), `runtime_peak_rss_ratio` / `runtime_sampled_peak_rss_ratio` /
`runtime_step_time_ratio` (difflet-runtime's model process: VmHWM / sampled peak, its denoise
phase per step against WanPipeline's denoising loop per step, host work included on both sides;
`runtime_step_vs_calls_ratio` the stricter one against WanPipeline's transformer calls alone);
per-program cos, and PSNR per frame end to end (and the floor's).

    python bench/real_size.py --checkpoint /data/wan2.1-1.3b-random [--work DIR]
        [--height 240 --width 416 --frames 17 --steps 4] [--stages lower,codegen,serve,runtime,pipeline,floor]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from real_size_children import GUIDANCE  # noqa: E402
RESULTS = REPO / "bench" / "results"
STAGES = ("lower", "codegen", "serve", "runtime", "pipeline", "floor")


def _tree_rss(pid: int) -> int:
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_measured(cmd: list[str], log: Path) -> dict:
    """Run `cmd` (its output to `log`), sampling its process tree's RSS: seconds and peak
    GiB; exits naming the command and its log when it fails."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss(proc.pid))
            time.sleep(0.2)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (rc {proc.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    return {"seconds": round(seconds, 1), "peak_rss_gib": round(peak / 2**30, 2)}


def _profile(args) -> str:
    return f"height={args.height},width={args.width},frames={args.frames},steps={args.steps}"


def stage_lower(args) -> dict:
    ir, planned = args.work / "wan.ir", args.work / "wan.opt.ir"
    low = run_measured(["difflet", "lower", "models/wan2.1.dsl", "--weights", str(args.checkpoint),
                        "--profile", _profile(args), "-o", str(ir)], args.work / "lower.log")
    opt = run_measured(["difflet", "opt", str(ir), "-o", str(planned)], args.work / "opt.log")
    return {"lower": low, "opt": opt}


def _programs(log: Path) -> dict:
    """codegen's one line per program: 'NAME: compiled|reused ... in S s (key K)'."""
    out = {}
    for line in log.read_text().splitlines():
        name, _, rest = line.partition(": ")
        if rest.startswith(("compiled", "reused")) and " in " in rest:
            out[name] = {"compiled": rest.startswith("compiled"),
                         "seconds": float(rest.rsplit(" in ", 1)[1].split(" s")[0])}
    return out


def stage_codegen(args) -> dict:
    import shutil

    store, planned = args.work / "store", args.work / "wan.opt.ir"
    res = {}
    for run, art in (("cold", args.work / "art"), ("warm", args.work / "art-warm")):
        shutil.rmtree(art, ignore_errors=True)
        if run == "cold":
            shutil.rmtree(store, ignore_errors=True)
        log = args.work / f"codegen-{run}.log"
        res[run] = run_measured(["difflet", "codegen", str(planned), "--weights", str(args.checkpoint),
                                 "-o", str(art), "--store", str(store)], log)
        res[run]["programs"] = _programs(log)
    shutil.rmtree(args.work / "art-warm", ignore_errors=True)  # its weights are the cold artifact's
    res["warm_compiled"] = sorted(n for n, p in res["warm"]["programs"].items() if p["compiled"])
    return res


def _child(args, stage: str) -> dict:
    """Run `stage` in a fresh interpreter (this file, `--child`), its tree's RSS sampled."""
    out = args.work / f"{stage}.json"
    cmd = [sys.executable, __file__, "--child", stage, "--checkpoint", str(args.checkpoint),
           "--work", str(args.work), "--height", str(args.height), "--width", str(args.width),
           "--frames", str(args.frames), "--steps", str(args.steps)]
    measured = run_measured(cmd, args.work / f"{stage}.log")
    return {**json.loads(out.read_text()), "process": measured}


def compare(work: Path) -> dict:
    import numpy as np

    sys.path.insert(0, str(REPO / "tests"))
    from oracle_util import psnr

    ours, ref = np.load(work / "difflet_video.npy"), np.load(work / "pipeline_video.npy")
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    frames = [round(float(psnr(a, b)), 2) for a, b in zip(ours, ref)]
    res = {"shape": list(ours.shape), "psnr_per_frame_db": frames, "min_psnr_db": min(frames)}
    if (work / "runtime_video.npy").is_file():  # served by difflet-runtime: the same frames as the runner's?
        served = np.load(work / "runtime_video.npy")
        res["runtime_psnr_per_frame_db"] = [round(float(psnr(a, b)), 2) for a, b in zip(served, ref)]
        res["runtime_equals_runner"] = bool(served.shape == ours.shape and (served == ours).all())
    if (work / "pipeline_math_video.npy").is_file():  # the floor: WanPipeline against itself, other SDPA kernel
        other = np.load(work / "pipeline_math_video.npy")
        res["floor_psnr_per_frame_db"] = [round(float(psnr(a, b)), 2) for a, b in zip(other, ref)]
        res["floor_min_psnr_db"] = min(res["floor_psnr_per_frame_db"])
    return res


RATIO_KEYS = ("peak_rss_ratio", "step_time_ratio", "runtime_peak_rss_ratio", "runtime_sampled_peak_rss_ratio",
              "runtime_step_time_ratio", "runtime_step_vs_calls_ratio")


def markdown(res: dict) -> str:
    rows = ["| stage | seconds | peak RSS GiB | notes |", "|---|---:|---:|---|"]
    if "lower" in res:
        for k in ("lower", "opt"):
            rows.append(f"| {k} | {res['lower'][k]['seconds']} | {res['lower'][k]['peak_rss_gib']} | |")
    if "codegen" in res:
        for run in ("cold", "warm"):
            c = res["codegen"][run]
            progs = ", ".join(f"{n} {'compiled' if p['compiled'] else 'reused'} {p['seconds']} s"
                              for n, p in c["programs"].items())
            rows.append(f"| codegen ({run}) | {c['seconds']} | {c['peak_rss_gib']} | {progs} |")
    for who in ("serve", "pipeline"):
        if who in res:
            r = res[who]
            name = "Difflet model process" if who == "serve" else "WanPipeline"
            rows.append(f"| {name}: load | {r['load_s']} | {r['rss_after_load_gib']} (after load) | |")
            if who == "serve":
                rows.append(f"| {name}: warm-up generation | {r['warm_up_s']} | | |")
            q = r["request"]
            sampled = f", {r['sampled_peak_rss_gib']} (sampled)" if "sampled_peak_rss_gib" in r else ""
            loop = f" (whole loop {q['loop_step_s']} s/step)" if "loop_step_s" in q else ""
            calls = " transformer calls" if loop else ""
            rows.append(f"| {name}: request | {q['total']} | {r['peak_rss_gib']} (VmHWM){sampled} | encode "
                        f"{q['encode']} s, denoise{calls} {q['denoise_step_s']} s/step{loop}, decode {q['decode']} s |")
        if who == "serve" and "runtime" in res:
            r, q = res["runtime"], res["runtime"]["request"]
            rows.append(f"| difflet-runtime: start (load + warm-up) | {r['start_s']} | | |")
            hwm = f"{r['model_process_vm_hwm_gib']} (VmHWM), " if "model_process_vm_hwm_gib" in r else ""
            rows.append(f"| difflet-runtime: request over gRPC | {q['total']} | model process {hwm}"
                        f"{r['model_process_peak_rss_gib']} (sampled); API process {r['api_process_peak_rss_gib']} "
                        f"| encode {q['encode']} s, "
                        f"denoise {q['denoise_step_s']} s/step, decode {q['decode']} s |")
    lines = ["\n".join(rows), ""]
    for key in RATIO_KEYS:
        if key in res:
            lines.append(f"- {key}: {res[key]}")
    if "cos" in res.get("pipeline", {}):
        lines.append(f"- per-program cos (Difflet's program vs the diffusers module, same inputs): {res['pipeline']['cos']}")
    if "end_to_end" in res:
        e2e = res["end_to_end"]
        lines.append(f"- PSNR per frame, Difflet vs WanPipeline (dB): {e2e['psnr_per_frame_db']}")
        if "runtime_psnr_per_frame_db" in e2e:
            lines.append(f"- PSNR per frame, served by difflet-runtime vs WanPipeline (dB): "
                         f"{e2e['runtime_psnr_per_frame_db']}; the same frames as the runner's: "
                         f"{e2e['runtime_equals_runner']}")
        if "floor_psnr_per_frame_db" in e2e:
            lines.append(f"- PSNR per frame, WanPipeline (math SDPA) vs WanPipeline (dB): {e2e['floor_psnr_per_frame_db']}")
    return "\n".join(lines) + "\n"


def _ratios(res: dict, ran: set[str]) -> None:
    """Difflet / WanPipeline ratios, each only from stages of this invocation (one run, one machine
    state); a ratio whose stages did not both run now is dropped rather than mixed across runs."""
    for key in RATIO_KEYS:
        res.pop(key, None)
    if "pipeline" not in ran:
        return
    pl = res["pipeline"]
    if "serve" in ran:
        sv = res["serve"]
        res["peak_rss_ratio"] = round(sv["peak_rss_gib"] / pl["peak_rss_gib"], 3)
        res["step_time_ratio"] = round(statistics.median(sv["request"]["steps_s"])
                                       / statistics.median(pl["request"]["steps_s"]), 3)
    if "runtime" in ran:  # the served request: each side's peak measured the same two ways
        rt = res["runtime"]
        res["runtime_peak_rss_ratio"] = round(rt["model_process_vm_hwm_gib"] / pl["peak_rss_gib"], 3)
        res["runtime_sampled_peak_rss_ratio"] = round(rt["model_process_peak_rss_gib"]
                                                      / pl["sampled_peak_rss_gib"], 3)
        # like for like: Difflet's denoise phase and WanPipeline's loop both hold the scheduler and CFG work
        res["runtime_step_time_ratio"] = round(rt["request"]["denoise_step_s"] / pl["request"]["loop_step_s"], 3)
        res["runtime_step_vs_calls_ratio"] = round(rt["request"]["denoise_step_s"]
                                                   / pl["request"]["denoise_step_s"], 3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True, help="bench/real_size_checkpoint.py's directory")
    ap.add_argument("--work", type=Path, default=Path("/tmp/difflet-real-size"))
    ap.add_argument("--height", type=int, default=240)
    ap.add_argument("--width", type=int, default=416)
    ap.add_argument("--frames", type=int, default=17)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--json", type=Path, default=RESULTS / "real_size.json")
    ap.add_argument("--child", choices=("serve", "runtime", "pipeline", "floor"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        from real_size_children import child_floor, child_pipeline, child_runtime, child_serve

        res = {"serve": child_serve, "runtime": child_runtime, "pipeline": child_pipeline,
               "floor": child_floor}[args.child](args)
        (args.work / f"{args.child}.json").write_text(json.dumps(res))
        return 0
    if not (args.checkpoint / "model_index.json").is_file():
        ap.error(f"--checkpoint {args.checkpoint}: no model_index.json (write one with bench/real_size_checkpoint.py)")
    stages = args.stages.split(",")
    if unknown := set(stages) - set(STAGES):
        ap.error(f"--stages: unknown {sorted(unknown)} (known: {', '.join(STAGES)})")
    if "pipeline" in stages and "serve" not in stages and not (args.work / "difflet_values.pt").is_file():
        ap.error(f"--stages: pipeline compares each program with the serve stage's captures, and "
                 f"{args.work / 'difflet_values.pt'} is missing: add serve to --stages")
    args.work.mkdir(parents=True, exist_ok=True)
    res = json.loads(args.json.read_text()) if args.json.is_file() else {}
    res["shape"] = {"height": args.height, "width": args.width, "frames": args.frames, "steps": args.steps,
                    "guidance": GUIDANCE}
    for stage in stages:
        print(f"== {stage}", file=sys.stderr, flush=True)
        res[stage] = {"lower": stage_lower, "codegen": stage_codegen}[stage](args) if stage in ("lower", "codegen") \
            else _child(args, stage)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2))
    _ratios(res, set(stages))
    if "serve" in res and "pipeline" in res and (args.work / "pipeline_video.npy").is_file():
        prev, res["end_to_end"] = res.get("end_to_end", {}), compare(args.work)
        # the floor is WanPipeline against itself: an earlier floor stage's figures stay valid
        res["end_to_end"].update({k: v for k, v in prev.items() if k.startswith("floor_")
                                  and k not in res["end_to_end"]})
    args.json.write_text(json.dumps(res, indent=2))
    md = markdown(res)
    args.json.with_suffix(".md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
