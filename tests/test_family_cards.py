"""Family facts (difflet/families/<family>/facts.py): what the API process says about each family
equals what the reference pipelines and the description declare, and the facts stay torch-free."""
import functools
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from difflet.frontend.lower import lower_file
from difflet.families import FAMILIES, facts_of, guidance_mode, uses_negative_prompt

REPO = Path(__file__).resolve().parent.parent
FOLDERS = sorted(p.parent.name for p in (REPO / "difflet" / "families").glob("*/facts.py"))


@functools.cache
def _lowered(dsl: str):
    return lower_file(str(REPO / "models" / f"{dsl}.dsl"))


def _module(dsl: str, edit=None, tmp_path=None):
    if edit is None:
        return _lowered(dsl)
    text = (REPO / "models" / f"{dsl}.dsl").read_text()
    assert edit[0] in text
    path = tmp_path / f"{dsl}.dsl"
    path.write_text(text.replace(*edit))
    return lower_file(str(path))


def test_importing_every_family_facts_leaves_torch_unloaded():
    assert FOLDERS == sorted(FAMILIES)  # every registered family has its folder and facts, and back
    code = ("import sys\nfrom difflet.families import FAMILIES, facts\n"
            "for f in FAMILIES: facts(f).rules\n"
            "assert 'torch' not in sys.modules, sorted(k for k in sys.modules if 'torch' in k)[:5]\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("dsl, mode, negative", [
    ("flux-tiny", "embedded", False), ("qwen-image-tiny", "true_cfg", True), ("wan2.1-tiny", "cfg", True),
    ("hunyuan-video-tiny", "embedded", False), ("ltx2-tiny", "cfg", True)])
def test_guidance_mode_is_the_descriptions(dsl, mode, negative):
    module = _module(dsl)
    assert (guidance_mode(module), uses_negative_prompt(module)) == (mode, negative)


def test_hunyuan_true_cfg_reads_the_negative_prompt(tmp_path):
    """HunyuanVideo serves embedded guidance by default; a description in true_cfg mode runs an
    unconditional pass on the negative prompt (the old per-family table said "embedded")."""
    module = _module("hunyuan-video-tiny", ('guidance: { mode: "embedded", scale: guidance }',
                                           'guidance: { mode: "true_cfg", scale: guidance, embedded: 6.0 }'),
                     tmp_path)
    assert (guidance_mode(module), uses_negative_prompt(module)) == ("true_cfg", True)


def test_video_frame_rates_are_the_pipelines(tmp_path):
    from diffusers import LTX2Pipeline

    ltx2 = _module("ltx2-tiny")
    default = inspect.signature(LTX2Pipeline.__call__).parameters["frame_rate"].default
    assert facts_of(ltx2).fps(ltx2) == default
    faster = _module("ltx2-tiny", ("frame_rate: 24.0", "frame_rate: 30.0"), tmp_path)
    assert facts_of(faster).fps(faster) == 30.0  # the rate the host schedule builds RoPE and the MP4 at
    for dsl, fps in (("hunyuan-video-tiny", 15.0), ("flux-tiny", 0.0)):  # the model card's export fps; images
        assert facts_of(_module(dsl)).fps(_module(dsl)) == fps
