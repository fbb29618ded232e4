"""bench/real_size.py's bookkeeping (issue 34): a Difflet / WanPipeline ratio comes only from
stages that ran in the same invocation (the JSON keeps earlier runs' stages, and a ratio of one
run's Difflet over another run's WanPipeline once read as met when neither run met it), and a
pipeline stage that would crash after its 9-minute request for want of the serve stage's
captures is refused before anything runs. The oracle is the rule as the module docstring states
it; each case below would fail on the code before that rule (stale ratios kept or mixed)."""
from __future__ import annotations

import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import real_size as rs  # noqa: E402


def _results() -> dict:
    """A JSON as a later invocation finds it: an earlier run's serve stage and stale ratios."""
    return {
        "serve": {"peak_rss_gib": 17.5, "request": {"steps_s": [40.0, 42.0, 41.0]}},
        "runtime": {"model_process_vm_hwm_gib": 15.9, "model_process_peak_rss_gib": 15.8,
                    "request": {"denoise_step_s": 42.0}},
        "pipeline": {"peak_rss_gib": 14.0, "sampled_peak_rss_gib": 16.0,
                     "request": {"steps_s": [44.0, 43.0, 45.0], "denoise_step_s": 40.0, "loop_step_s": 42.0}},
        "peak_rss_ratio": 0.5, "step_time_ratio": 0.5, "runtime_step_time_ratio": 0.5,
    }


def test_ratios_come_only_from_the_stages_of_this_invocation():
    res = _results()
    rs._ratios(res, {"runtime", "pipeline"})
    # the serve stage is an earlier run's: its ratios are dropped, not recomputed against this pipeline
    assert "peak_rss_ratio" not in res and "step_time_ratio" not in res
    assert res["runtime_peak_rss_ratio"] == round(15.9 / 14.0, 3)
    assert res["runtime_sampled_peak_rss_ratio"] == round(15.8 / 16.0, 3)
    # like for like: Difflet's denoise phase over WanPipeline's whole loop; the calls-only one beside it
    assert res["runtime_step_time_ratio"] == 1.0
    assert res["runtime_step_vs_calls_ratio"] == round(42.0 / 40.0, 3)


def test_no_ratio_without_a_pipeline_stage_now():
    res = _results()
    rs._ratios(res, {"serve", "runtime"})
    assert not any(k in res for k in rs.RATIO_KEYS)


def test_serve_and_pipeline_together_give_the_runner_ratios():
    res = _results()
    rs._ratios(res, {"serve", "pipeline"})
    assert res["peak_rss_ratio"] == round(17.5 / 14.0, 3)
    assert res["step_time_ratio"] == round(41.0 / 44.0, 3)  # medians of the per-step times
    assert "runtime_step_time_ratio" not in res


def test_pipeline_without_the_serve_captures_is_refused_before_it_runs(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model_index.json").write_text("{}")
    out = tmp_path / "out.json"
    with pytest.raises(SystemExit) as exc:
        rs.main(["--checkpoint", str(ckpt), "--work", str(tmp_path / "work"), "--stages", "runtime,pipeline",
                 "--json", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "difflet_values.pt" in err and "add serve to --stages" in err and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "work").exists()  # nothing started, nothing written
