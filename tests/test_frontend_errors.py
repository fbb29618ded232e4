"""Errors of `difflet lower`: every invalid DSL case, bad `--profile` values, and valid cases beside.

Each tests/golden/frontend/invalid/*.dsl is tests/golden/frontend/valid/mini.dsl broken once
(shape_video_* break valid/video_inline.dsl, shape_audio_* break valid/audio_video.dsl); its
first two lines are `# expect: LINE:COL: message` and `# snippet: text`, reviewed by eye.
`UPDATE_GOLDEN=1` rewrites those two lines from the current output (review the diff).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from difflet.cli import main
from difflet.frontend.lower import lower_file
from difflet.ir.nodes import Op

REPO = Path(__file__).resolve().parent.parent
FRONTEND = Path("tests") / "golden" / "frontend"
INVALID = sorted((REPO / FRONTEND / "invalid").glob("*.dsl"))


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def _lower(*args: str):
    return CliRunner().invoke(main, ["lower", *args])


def _expectation(path: Path) -> tuple[str, str]:
    expect, snippet = path.read_text().splitlines()[:2]
    assert expect.startswith("# expect: ") and snippet.startswith("# snippet: "), path
    return expect[len("# expect: "):], snippet[len("# snippet: "):]


@pytest.mark.parametrize("case", INVALID, ids=lambda p: p.stem)
def test_invalid_dsl_reports_location_message_and_snippet(case: Path) -> None:
    rel = str(FRONTEND / "invalid" / case.name)
    r = _lower(rel)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.stdout == ""
    head, snippet = r.stderr.rstrip("\n").split("\n")
    if os.environ.get("UPDATE_GOLDEN") == "1":
        body = case.read_text().split("\n", 2)[2]
        case.write_text(f"# expect: {head[len(f'error: {rel}:'):]}\n# snippet: {snippet.strip()}\n{body}")
    want_head, want_snippet = _expectation(case)
    assert head == f"error: {rel}:{want_head}"
    assert snippet == f"    {want_snippet}"
    # the location points into the file: at the offending text, or (syntax) on its line
    line, col = (int(x) for x in want_head.split(":")[:2])
    source_line = case.read_text().splitlines()[line - 1]
    if "syntax error" in want_head:
        assert source_line.strip() == want_snippet
    else:
        assert " ".join(source_line[col - 1:].split()).startswith(want_snippet.removesuffix(" ..."))


def test_every_error_class_has_a_case() -> None:
    stems = {p.stem.split("_")[0] for p in INVALID}
    assert {"syntax", "unknown", "undefined", "shape"} <= stems


def test_valid_base_of_the_invalid_cases_lowers() -> None:
    m = lower_file(str(FRONTEND / "valid" / "mini.dsl"))
    assert [c.name for c in m.components()] == ["transformer", "vae"]
    assert m.component("transformer").find(Op.INPUT, "hidden_states")[0].results[0].type.shape == (1, 64, 16)


def test_video_description_with_checkpoint_configs_lowers() -> None:
    """3-D latents, self/cross attention, configs from checkpoint (so no param counts)."""
    m = lower_file(str(FRONTEND / "valid" / "video.dsl"))
    t = m.component("transformer")
    assert "config" not in t.attrs and "params" not in t.attrs
    assert t.find(Op.INPUT, "hidden_states")[0].results[0].type.shape == (1, 16, 21, 60, 104)
    kinds = [(a.name, a.attrs["kind"]) for a in t.find(Op.ATTENTION)]
    assert kinds == [("blocks.*.attn1", "self"), ("blocks.*.attn2", "cross")]
    assert m.component("vae").find(Op.OUTPUT, "sample")[0].results[0].type.shape == (1, 3, 81, 480, 832)


def test_video_latent_channels_are_dim_1() -> None:
    """[B, C, F, H, W]: in_channels 4 is dim 1; the last dim (width/8 = 8) is not channels."""
    m = lower_file(str(FRONTEND / "valid" / "video_inline.dsl"))
    t = m.component("transformer")
    assert t.find(Op.INPUT, "hidden_states")[0].results[0].type.shape == (1, 4, 2, 4, 8)
    assert t.find(Op.OUTPUT, "sample")[0].results[0].type.shape == (1, 4, 2, 4, 8)


def test_audio_sites_are_checked_against_the_audio_config_keys() -> None:
    """LTX-2: audio self and audio<->video cross sites run at the audio width (2 x 4), the video
    site at the main width (2 x 8); both lower."""
    m = lower_file(str(FRONTEND / "valid" / "audio_video.dsl"))
    dims = {a.name.split(".")[-1]: (a.attrs["heads"], a.attrs["head_dim"])
            for a in m.component("transformer").find(Op.ATTENTION)}
    assert dims == {"attn1": (2, 8), "audio_attn1": (2, 4), "audio_to_video_attn": (2, 4)}


@pytest.mark.parametrize("profile, where, message", [
    ("heigth=64", "models/flux-tiny.dsl:4:1",
     "--profile: unknown profile parameter 'heigth' (known: height, width, steps, guidance, "
     "max_text, clip_len, dtype, batch)"),
    ("height=64.5", "models/flux-tiny.dsl:7:5",
     "--profile height='64.5': expected an integer like the default 32"),
    ("steps=four", "models/flux-tiny.dsl:9:5",
     "--profile steps='four': expected an integer like the default 4"),
    ("guidance=high", "models/flux-tiny.dsl:10:5",
     "--profile guidance='high': expected a number like the default 3.5"),
])
def test_bad_profile_override_is_located_at_the_parameter(profile: str, where: str, message: str) -> None:
    r = _lower("models/flux-tiny.dsl", "--profile", profile)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.stderr == f"error: {where}: {message}\n    {profile}\n"


def test_a_profile_alias_follows_each_shape_bucket_and_takes_overrides_of_its_targets_type() -> None:
    """flux-tiny-kontext says `image_width = width`: the input image's tokens follow each bucket's
    size (and the VAE encoder's input with them); `--profile image_width=40` pins it (an integer,
    the target's type) or names another parameter; a word that is neither is refused."""
    from difflet.ir.buckets import views

    kontext = "models/flux-tiny-kontext.dsl"

    def shapes(module):
        return (module.component("transformer").find(Op.INPUT)[0].results[0].type.shape,
                module.component("vae_encoder").find(Op.INPUT)[0].results[0].type.shape)

    sized = dict(views(lower_file(kontext, shapes=["32x32", "48x32"])))
    assert shapes(sized["32x32"]) == ((1, 8 * 8 + 8 * 8, 16), (1, 3, 32, 32))
    assert shapes(sized["48x32"]) == ((1, 8 * 12 + 8 * 12, 16), (1, 3, 32, 48))  # 48 wide: 12 token columns
    assert shapes(lower_file(kontext, {"image_width": "40"})) == ((1, 8 * 8 + 8 * 10, 16), (1, 3, 32, 40))
    assert shapes(lower_file(kontext, {"image_width": "height", "width": "48"})) == \
        ((1, 8 * 12 + 8 * 8, 16), (1, 3, 32, 32))
    r = _lower(kontext, "--profile", "image_width=wide")
    assert r.exit_code == 2 and "--profile image_width='wide': expected an integer like the default 32" in r.stderr


def test_profile_override_that_breaks_a_shape_is_located_in_the_dsl() -> None:
    r = _lower("models/flux-tiny.dsl", "--profile", "height=34")
    assert r.exit_code == 2
    assert r.stderr.startswith("error: models/flux-tiny.dsl:53:") and "does not divide exactly" in r.stderr


def test_malformed_profile_argument() -> None:
    r = _lower("models/flux-tiny.dsl", "--profile", "height")
    assert r.exit_code == 2
    assert r.stderr == "error: --profile: --profile expects key=value[,key=value...], got 'height'\n    height\n"


def test_missing_file_is_a_usage_error_not_a_traceback() -> None:
    r = _lower("models/nope.dsl")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "models/nope.dsl" in r.stderr


def test_real_process_exit_code_and_stderr() -> None:
    """Through the installed entry point: exit 2, one located line, no traceback."""
    case = FRONTEND / "invalid" / "syntax_missing_colon.dsl"
    proc = subprocess.run([sys.executable, "-m", "difflet.cli", "lower", str(case)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {case}:22:25: syntax error")
    assert "Traceback" not in proc.stderr
