"""Golden tests of `difflet lower`: the printed pipeline IR of flux-tiny, of FLUX.1-dev at
1024x1024 and of ltx2-tiny, their text/binary round trips, and facts checked against /work/shared/models.md.

`UPDATE_GOLDEN=1 python -m pytest tests/test_frontend_golden.py` rewrites the golden files;
review the diff by eye before committing.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from difflet.cli import main
from difflet.frontend.lower import lower_file
from difflet.ir.binary import load, save
from difflet.ir.nodes import Op, RuntimeType, TensorType
from difflet.ir.text import parse_module, print_module

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden" / "frontend"
CASES = {  # golden file -> (DSL path as given, --profile overrides)
    "flux-tiny.ir.txt": ("models/flux-tiny.dsl", None),
    "flux-1024.ir.txt": ("models/flux.dsl", {"height": "1024", "width": "1024"}),
    # a family option (`options { stg_blocks }`) and a per-call runtime input (guidance_pass)
    "ltx2-tiny.ir.txt": ("models/ltx2-tiny.dsl", None),
}


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # locations hold the DSL path as given: keep it repo-relative


def _lowered(golden: str):
    path, overrides = CASES[golden]
    return lower_file(path, overrides)


@pytest.mark.parametrize("golden", sorted(CASES))
def test_lowered_ir_matches_golden(golden: str) -> None:
    text = print_module(_lowered(golden))
    target = GOLDEN / golden
    if os.environ.get("UPDATE_GOLDEN") == "1":
        target.write_text(text)
    assert text == target.read_text()


@pytest.mark.parametrize("golden", sorted(CASES))
def test_golden_text_round_trips_to_the_lowered_module(golden: str) -> None:
    text = (GOLDEN / golden).read_text()
    parsed = parse_module(text, golden)
    assert parsed == _lowered(golden)
    assert print_module(parsed) == text


@pytest.mark.parametrize("golden", sorted(CASES))
def test_golden_binary_round_trips(golden: str, tmp_path: Path) -> None:
    module = parse_module((GOLDEN / golden).read_text(), golden)
    save(module, tmp_path / "m.ir")
    assert load(tmp_path / "m.ir") == module


def test_flux_param_counts_match_models_md() -> None:
    """Meta-device counts equal the numbers recorded in /work/shared/models.md."""
    m = _lowered("flux-1024.ir.txt")
    counts = {c.name: c.attrs["params"] for c in m.components()}
    assert counts == {"text_encoder": 123_060_480, "text_encoder_2": 4_762_310_656,
                      "transformer": 11_901_408_320, "vae": 83_819_683}
    t = m.component("transformer").attrs
    assert t["num_blocks"] == 19 + 38
    # every block linear is inside the 57 blocks; embedders and final projections are not
    assert 0.99 * t["params"] < t["params_blocks_linear"] < t["params"]
    assert m.component("text_encoder_2").attrs["num_blocks"] == 24
    assert m.component("vae").attrs["num_blocks"] == 0


def test_flux_shapes_follow_the_pipeline_facts() -> None:
    """1024^2 -> 4096 tokens x 64 ch; T5 512 tokens; valid_text a runtime value in [1, 512]."""
    m = _lowered("flux-1024.ir.txt")
    t = m.component("transformer")
    assert t.find(Op.INPUT, "hidden_states")[0].results[0].type == TensorType("bfloat16", (1, 4096, 64))
    assert t.find(Op.INPUT, "encoder_hidden_states")[0].results[0].type.shape == (1, 512, 4096)
    valid = t.find(Op.INPUT, "valid_text")[0]
    assert valid.args == ("valid_text",) and valid.results[0].type == RuntimeType("int64", 1, 512)
    assert m.find(Op.RUNTIME, "valid_text")[0].attrs["default"] == 512
    assert m.find(Op.RUNTIME, "step")[0].results[0].type == RuntimeType("int64", 0, 27)
    assert m.component("vae").find(Op.INPUT, "z")[0].results[0].type.shape == (1, 16, 128, 128)
    denoise = m.find(Op.SCHEDULE, "main")[0].find(Op.STEP, "flux.denoise")[0]
    assert denoise.attrs["guidance"]["mode"] == "embedded" and denoise.attrs["guidance"]["scale"] == 3.5


def test_profile_override_reshapes_every_component() -> None:
    m = lower_file("models/flux-tiny.dsl", {"height": "64", "width": "48", "steps": "10"})
    assert m.attrs["profile"]["height"] == 64 and m.attrs["profile"]["steps"] == 10
    t = m.component("transformer")
    assert t.find(Op.INPUT, "hidden_states")[0].results[0].type.shape == (1, 16 * 12, 16)
    assert t.find(Op.INPUT, "img_rope")[0].results[0].type.shape == (16 * 12, 32)  # cos | sin, head_dim 16
    assert m.component("vae").find(Op.OUTPUT, "sample")[0].results[0].type.shape == (1, 3, 64, 48)
    assert m.find(Op.RUNTIME, "step")[0].results[0].type.hi == 9


def test_cli_lower_then_show(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "flux.ir"
    r = runner.invoke(main, ["lower", "models/flux.dsl", "--profile", "height=1024,width=1024",
                             "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert load(out) == _lowered("flux-1024.ir.txt")
    shown = runner.invoke(main, ["show", str(out)])
    assert shown.exit_code == 0, shown.output
    assert "input @hidden_states -> %hidden_states : tensor<1x4096x64xbfloat16>" in shown.output
    assert "input @input_ids -> %input_ids : tensor<1x512xint64>" in shown.output
    assert "input @valid_text(%valid_text) -> %valid_text : runtime<int64 in [1, 512]>" in shown.output


def test_cli_lower_without_output_prints_the_golden_text() -> None:
    r = CliRunner().invoke(main, ["lower", "models/flux-tiny.dsl"])
    assert r.exit_code == 0, r.output
    assert r.stdout == (GOLDEN / "flux-tiny.ir.txt").read_text()
