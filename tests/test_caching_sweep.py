"""bench/caching_sweep.py end to end on tiny descriptions (their eager programs, random:0 weights):
an image family (flux-tiny, 16 steps, keep 5:5 and 2:1) and a video family (wan2.1-tiny, 12
steps, keep 5:5 only), one prompt and seed each, through its CLI (`main`).

Oracles: the denoiser program calls counted by wrapping the runner's denoiser program (per row,
between the sweep's row logs), the schedule rule worked by hand for cadence:2, and PSNR computed
here with numpy from outputs generated here, outside the sweep.
"""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("caching_sweep", REPO / "bench" / "caching_sweep.py")
caching_sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(caching_sweep)

PROMPT = "a red fox in the snow"  # bench/caching.py's first evaluation prompt
CASES = {  # model: (steps, extra argv, cadence:2's calls by hand: keep 5 + 5 and every 2nd window step)
    "flux-tiny": (16, [], 10 + 3),  # window 5..10: computes 5, 7, 9
    "wan2.1-tiny": (12, ["--keep", "5,5"], 10 + 1),  # window 5..6: computes 5
}


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 20 * math.log10(255.0) - 10 * math.log10(mse)


def _output(runner, steps: int, cache: str = "off") -> np.ndarray:
    result = runner.generate(runner.resolve(prompt=PROMPT, seed=0, steps=steps, cache=cache))
    return result.image if result.image is not None else result.video


@pytest.fixture(scope="module", params=sorted(CASES))
def swept(request, tmp_path_factory):
    from conftest import shared_store_dir

    name = request.param
    steps, extra, _ = CASES[name]
    model = str(REPO / "models" / f"{name}.dsl")
    runner = caching_sweep.build_runner(model, "random:0", shared_store_dir(), eager=True)
    outputs = {"ref": _output(runner, steps), "fewer": _output(runner, steps // 2),
               "cadence:2": _output(runner, steps, "cadence:2")}
    den = runner.module.components("denoiser")[0].name
    inner, count, per_row = runner.env.programs[den], [0], []

    def counting(*args, **kwargs):
        count[0] += 1
        return inner(*args, **kwargs)

    runner.env.programs[den] = counting
    sweep = caching_sweep.cq.sweep

    def logged_sweep(*args, **kwargs):
        def log(line):
            per_row.append((json.loads(line)["setting"], count[0] - sum(c for _, c in per_row)))
        return sweep(*args, **{**kwargs, "log": log})

    mp = pytest.MonkeyPatch()
    mp.setattr(caching_sweep.cq, "sweep", logged_sweep)
    mp.setattr(caching_sweep, "build_runner", lambda *a, **k: runner)
    prefix = str(tmp_path_factory.mktemp("sweep") / name)
    try:
        assert caching_sweep.main(["--model", model, "--eager", "--prompts", "1", "--seeds", "0",
                                   "--steps", str(steps), "--out", prefix, *extra]) == 0
    finally:
        mp.undo()
    rows = json.loads(Path(prefix + ".json").read_text())
    return name, steps, rows, dict(per_row), outputs, Path(prefix + ".md").read_text()


def test_rows_are_the_reference_fewer_steps_and_every_mode(swept):
    name, steps, rows, _, _, md = swept
    keeps = [(5, 5)] if name == "wan2.1-tiny" else [(5, 5), (2, 1)]
    fewer = caching_sweep.fewer_counts(steps, keeps)
    assert [r["mode"] for r in rows[:1 + len(fewer)]] == ["off"] + ["fewer-steps"] * len(fewer)
    assert len(rows) == 1 + len(fewer) + len(caching_sweep.cq.settings(keeps))
    for r in rows:
        assert set(r) == {"mode", "setting", "compute", "wall_s", "psnr", "psnr_min"}
    ref = rows[0]
    assert (ref["setting"], ref["compute"], ref["psnr"], ref["psnr_min"]) == (str(steps), 1.0, None, None)
    for r in rows[1:1 + len(fewer)]:
        assert r["compute"] == round(int(r["setting"]) / steps, 4)
    assert "| comparison |" in md and "| cadence 2 | cadence:2 |" in md


def test_compute_is_the_denoiser_calls_counted(swept):
    name, steps, rows, calls, _, _ = swept
    per_step, rest = divmod(calls[str(steps)], steps)  # the reference: every step computed
    assert rest == 0 and per_step in (1, 2)  # a CFG family may call the program twice a step
    assert len(calls) == len(rows)
    for r in rows:
        assert r["compute"] == round(calls[r["setting"]] / per_step / steps, 4), r
    cadence = next(r for r in rows if r["setting"] == "cadence:2")
    assert cadence["compute"] == round(CASES[name][2] / steps, 4)


def test_psnr_is_against_the_uncached_output(swept):
    _, steps, rows, _, outputs, _ = swept
    by = {r["setting"]: r for r in rows}
    for key, setting in (("fewer", str(steps // 2)), ("cadence:2", "cadence:2")):
        expected = _psnr(outputs[key], outputs["ref"])
        assert math.isfinite(expected)  # the oracle itself differs from the reference
        assert by[setting]["psnr"] == by[setting]["psnr_min"] == pytest.approx(expected, abs=0.006)


def test_highlights_pair_each_pick_with_the_most_steps_not_above_its_compute():
    rows = [{"mode": "off", "setting": "28", "compute": 1.0, "psnr": None},
            {"mode": "fewer-steps", "setting": "8", "compute": 0.2857, "psnr": 30.0},
            {"mode": "fewer-steps", "setting": "10", "compute": 0.3571, "psnr": 33.0},
            {"mode": "fewer-steps", "setting": "16", "compute": 0.5714, "psnr": 40.0},
            {"mode": "cadence", "setting": "cadence:6+keep:2:1", "compute": 0.2857, "psnr": 20.0},
            {"mode": "cadence", "setting": "cadence:4+forecast:1+keep:2:1", "compute": 0.3571, "psnr": 39.0},
            {"mode": "online-delta", "setting": "online-delta:3", "compute": 0.55, "psnr": 50.0},
            {"mode": "cadence", "setting": "cadence:2", "compute": 0.6786, "psnr": 45.0}]
    got = [(label, r["setting"], f and f["setting"]) for label, r, f in caching_sweep.highlights(rows)]
    assert got == [("best at <= 0.4", "cadence:4+forecast:1+keep:2:1", "10"),
                   ("best at 0.5-0.7", "online-delta:3", "10"),  # 16 steps cost more than 0.55
                   ("cadence 2", "cadence:2", "16")]
