"""bench/trn2_acceptance.sh on a host without the Neuron SDK: --dry-run prints every command and runs
none; a real run goes as far as the first SDK call (lower and the layouts' plans, which need no SDK) and
stops there with one line naming what is missing, exit 2; bad arguments are usage errors (exit 2)."""
from __future__ import annotations

import importlib.util
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "trn2_acceptance.sh"
NO_SDK = importlib.util.find_spec("torch_neuronx") is None


def _run(*args, cwd, timeout=600):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _commands(stdout: str) -> list[list[str]]:
    return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]


def test_dry_run_prints_every_command_and_runs_none(tmp_path):
    r = _run("--dry-run", "--checkpoint", "/ckpt/FLUX.1-dev", "--out", "out", cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    cmds = _commands(r.stdout)
    difflet = [c[1] for c in cmds if c[0] == "difflet"]
    steps = [c[2] for c in cmds if c[0] != "difflet" and c[1].endswith("trn2_acceptance.py")]
    # lower, three plans (tp4, tp2cp2 Ulysses, the inductor reference), codegen through `timed`
    assert difflet == ["lower", "opt", "opt", "opt"], r.stdout
    assert steps == ["preflight", "sdk", "timed", "timed", "timed", "compare", "serve", "compare", "serve",
                     "report"], r.stdout
    codegens = [c[c.index("--") + 1:] for c in cmds if "timed" in c]
    assert [c[c.index("--backend") + 1] for c in codegens] == ["neuron", "neuron", "inductor"]
    assert all(c[c.index("--weights") + 1] == "/ckpt/FLUX.1-dev" for c in codegens)
    plans = [c for c in cmds if c[:2] == ["difflet", "opt"]]
    assert ["--parallel", "tp2cp2", "--attention", "ulysses"] == plans[1][3:7]
    serve = next(c for c in cmds if "serve" in c)
    assert serve[serve.index("--seed") + 1] == "42" and serve[serve.index("--steps") + 1] == "28"
    assert serve[serve.index("--size") + 1] == "1024"
    assert not (tmp_path / "out").exists()  # nothing ran


@pytest.mark.parametrize("args, says", [
    ([], "--checkpoint DIR is required"),
    (["--checkpoint", "x", "--layouts", "tp8"], "'tp8' is not one of"),
    (["--checkpoint", "x", "--requests", "-1"], "whole number"),
    (["--checkpoint", "x", "--bogus"], "unknown argument --bogus"),
    (["--checkpoint"], "--checkpoint needs a value"),
])
def test_usage_errors_exit_2_with_one_reason(tmp_path, args, says):
    r = _run(*args, cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_directory_that_is_no_flux_checkpoint_is_refused_before_lowering(tmp_path):
    (tmp_path / "ckpt").mkdir()
    r = _run("--checkpoint", str(tmp_path / "ckpt"), "--out", "out", cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "no model_index.json" in r.stderr, r.stderr
    assert not (tmp_path / "out" / "flux.ir").exists()


@pytest.mark.slow
@pytest.mark.skipif(not NO_SDK, reason="the Neuron SDK is installed here: the script would go on")
def test_without_the_sdk_it_runs_to_the_first_sdk_call_and_names_what_is_missing(tmp_path):
    from oracle_util import planned_tiny, random_checkpoint

    ckpt = random_checkpoint(planned_tiny(REPO / "models" / "flux-tiny4.dsl"))  # 4 heads: tp4 and tp2cp2 plan
    r = _run("--checkpoint", str(ckpt), "--out", "out", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("trn2_acceptance: stopped before the first Neuron SDK call: missing torch_neuronx")
    assert "neuronx_distributed" in last and "nkilib" in last and "Traceback" not in r.stderr
    out = tmp_path / "out"
    # everything before the SDK ran: the lowered IR and each layout's plan
    assert {p.name for p in out.glob("flux*.ir")} == {"flux.ir", "flux.tp4.ir", "flux.tp2cp2.ir", "flux.cpu.ir"}
    assert not list(out.glob("compile-*.json")) and not (out / "art-tp4").exists()


def _helper():
    spec = importlib.util.spec_from_file_location("trn2_acceptance", REPO / "bench" / "trn2_acceptance.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_compare_reads_every_program_of_two_arts(flux_tiny_art, tmp_path):
    """The compare step on two loads of one inductor ART (what a trn2 host runs with a neuron ART and the
    inductor one): every program compared on the same seeded inputs, cosine 1 and max abs 0, the
    denoiser timed."""
    import json

    out = tmp_path / "compare.json"
    _helper().main(["compare", "--neuron", str(flux_tiny_art), "--reference", str(flux_tiny_art),
                    "--json", str(out), "--timed", "2"])
    got = json.loads(out.read_text())
    assert set(got["programs"]) == {"text_encoder", "text_encoder_2", "transformer", "vae"}
    for row in got["programs"].values():
        assert row["ok"] and all(o["max_abs"] == 0 and o["cosine"] > 0.999999 for o in row["outputs"])
    assert got["step_ms"] > 0 and got["programs"]["transformer"]["step_ms"] == got["step_ms"]


def test_report_puts_the_papers_figures_beside_ours_and_names_a_refused_layout(tmp_path):
    import json

    (tmp_path / "compile-tp4.json").write_text(json.dumps({"seconds": 1200.0, "rc": 0}))
    (tmp_path / "serve-tp4.json").write_text(json.dumps({"load_s": 30.5, "request_s": 15.0}))
    (tmp_path / "compare-tp4.json").write_text(json.dumps(
        {"step_ms": 280.0, "programs": {"transformer": {"outputs": [{"cosine": 0.9995}], "ok": True}}}))
    (tmp_path / "compile-tp2cp2.json").write_text(json.dumps({"rc": 2, "refused": "error: not sp or cp"}))
    _helper().main(["report", "--dir", str(tmp_path), "--layouts", "tp4", "tp2cp2"])
    md = (tmp_path / "trn2_acceptance.md").read_text().splitlines()
    assert md[2] == ("| tp4 | 20.0 min (paper 16.7 min) | 30.5 s (paper 23.0 s) | 280.0 ms (paper 270.0 ms) "
                     "| 15.0 s (paper 14.2 s) | 0.999500 (need >= 0.999) |")
    assert md[3] == "| tp2cp2 | refused: error: not sp or cp | | | | |"
    assert json.loads((tmp_path / "trn2_acceptance.json").read_text())["layouts"]["tp4"]["serve"]["load_s"] == 30.5


def test_closeness_and_a_disagreeing_program_fail_the_report(tmp_path):
    """Orthogonal outputs: cosine 0, max abs 1; the report then exits 1 naming the program."""
    import json

    import torch

    helper = _helper()
    row = helper._closeness(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
    assert row["cosine"] == 0.0 and row["max_abs"] == 1.0
    (tmp_path / "compare-tp4.json").write_text(json.dumps(
        {"programs": {"vae": {"outputs": [row], "ok": row["cosine"] >= helper.MIN_COSINE}}}))
    with pytest.raises(SystemExit) as exit_:
        helper.main(["report", "--dir", str(tmp_path), "--layouts", "tp4"])
    assert exit_.value.code == 1
