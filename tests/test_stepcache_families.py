"""The step-caching probe of every family's denoiser beside FLUX's (Qwen-Image, Wan 2.1,
HunyuanVideo, LTX-2, FLUX.2 [klein]), each on its tiny variant: the compiled probe, `difflet calibrate` and a
calibrated serve.

Oracles: the feature is the input the whole diffusers denoiser hands its first block's
attention (captured by a pre-hook on that module while the unsplit class runs, stopped there),
and the compiled probe's score is the relative L1 change between two such features; "compiles
nothing" is the store's entries and a second codegen's report before and after serving every
cache mode. Each probe compiles once into the shared test store (the other programs are reused).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from calibration_oracle import expected_selection, fit_statistics
from conftest import REPO, shared_store_dir
from difflet.cli import main
from difflet.ir.nodes import Op, RuntimeType
from oracle_util import compile_art, random_checkpoint

pytestmark = pytest.mark.slow  # compiles and serves several artifacts: full suite only

# tiny description -> the first block's attention module (where the modulated input enters)
FAMILIES = {
    "qwen-image-tiny": "transformer_blocks.0.attn",
    "wan2.1-tiny": "blocks.0.attn1",
    "hunyuan-video-tiny": "transformer_blocks.0.attn",
    "ltx2-tiny": "transformer_blocks.0.attn1",
    "flux2-tiny": "transformer_blocks.0.attn",
}
CAL_STEPS = 12  # the fewest calibrate accepts: 5 + 5 kept full, 2 cacheable


class _Stop(Exception):
    pass


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """(name, planned module with the probe, checkpoint, compiled ART) of one tiny model."""
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    module = optimize(lower_file(str(REPO / "models" / f"{request.param}.dsl")), parallel="tp1",
                      target="cpu", backend="inductor", probe="separate")
    ckpt = random_checkpoint(module)
    art = compile_art(module, ckpt, tmp_path_factory.mktemp(f"{request.param}-probe-art"))
    return request.param, module, ckpt, art


def denoiser_values(module, seed: int) -> dict[str, torch.Tensor]:
    """Random values for every denoiser input (runtime values at their upper bound)."""
    den = [c for c in module.components() if c.attrs.get("role") == "denoiser"][0]
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for n in den.find(Op.INPUT):
        t = n.results[0].type
        if isinstance(t, RuntimeType):
            out[n.name] = torch.tensor(t.hi)
        elif n.name == "timestep":
            out[n.name] = torch.rand(t.shape, generator=gen) * 0.8 + 0.1
        else:
            out[n.name] = torch.randn(t.shape, generator=gen).to(getattr(torch, t.dtype))
    return out


def oracle_feature(name, module, ckpt, values) -> torch.Tensor:
    """The first attention's visual input as the whole diffusers denoiser computes it."""
    from difflet.codegen.build import wrap_program_module
    from difflet.codegen.checkpoint import load_component

    den = [c for c in module.components() if c.attrs.get("role") == "denoiser"][0]
    model = load_component(den, ckpt)
    program = wrap_program_module(model, den)
    seen = {}

    def hook(_mod, args, kwargs):
        seen["x"] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        raise _Stop

    model.get_submodule(FAMILIES[name]).register_forward_pre_hook(hook, with_kwargs=True)
    with torch.no_grad(), pytest.raises(_Stop):
        program(*[values[n.name] for n in den.find(Op.INPUT)])
    return seen["x"].double()


def test_probe_feature_and_score_equal_the_diffusers_module(family):
    from difflet.codegen.artifacts import load_artifacts
    from difflet.codegen.probe import build_probe_module, probe_node, program_view

    name, module, ckpt, art = family
    a, b = denoiser_values(module, 0), denoiser_values(module, 1)
    fa, fb = oracle_feature(name, module, ckpt, a), oracle_feature(name, module, ckpt, b)
    node = probe_node(module)
    view = [n.name for n in program_view(node).find(Op.INPUT)]
    with torch.no_grad():
        feature = build_probe_module(node, ckpt).compute(*[a[n] for n in view])[1]
    assert feature.shape == fa.shape
    torch.testing.assert_close(feature.double(), fa, rtol=1e-5, atol=1e-5)
    probe = load_artifacts(art).probe  # the compiled program
    probe(a)
    want = float((fb - fa).abs().mean() / fa.abs().mean())
    assert probe(b) == pytest.approx(want, rel=1e-4)
    assert probe(b) == pytest.approx(0.0, abs=1e-6)  # the saved feature is the one just computed


@pytest.fixture(scope="module")
def calibrated(family, tmp_path_factory):
    name, _, _, art = family
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts.write_text("a cat\na house by a lake\n")
    cal = tmp_path_factory.mktemp("cal") / f"{name}.json"
    res = CliRunner().invoke(main, ["calibrate", str(art), "--prompts", str(prompts), "--steps",
                                    str(CAL_STEPS), "-o", str(cal)])
    assert res.exit_code == 0, res.output
    return cal


def test_calibrate_writes_a_file_tied_to_the_probe(family, calibrated):
    from difflet.codegen.manifest import read_manifest

    data = json.loads(calibrated.read_text())
    manifest = read_manifest(family[3])
    assert data["probe_cache_key"] == manifest.components["probe"].cache_key
    r2, pearson = fit_statistics(data)  # recomputed from the file's samples (calibration_oracle.py)
    assert data["r2"] == pytest.approx(r2, abs=1e-6) and data["selected"] == expected_selection(r2, pearson)
    assert len(data["samples"]) == 2 and len(data["samples"][0]["scores"]) == CAL_STEPS


def _files(root) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_calibrated_serve_skips_steps_and_modes_compile_nothing(family, calibrated, tmp_path):
    from difflet.codegen.driver import codegen
    from difflet.runtime.runner import ModelRunner

    name, module, ckpt, art = family
    before = _files(art)
    runner = ModelRunner.from_artifacts(art, cache=f"calibrated:{calibrated}")
    steps = 14
    full = runner.generate(runner.resolve(prompt="a lighthouse", seed=3, steps=steps, cache="off"))
    res = runner.generate(runner.resolve(prompt="a lighthouse", seed=3, steps=steps))  # the server default
    assert res.stats["probe_calls"] == steps and np.isfinite(res.stats["scores"][1:]).all()
    loose = runner.generate(runner.resolve(prompt="a lighthouse", seed=3, steps=steps,
                                           cache=f"calibrated:{calibrated}:1e9"))
    assert loose.stats["cached_steps"] > 0 and loose.stats["denoiser_calls"] < full.stats["denoiser_calls"]
    # controller.py's documented rule at 14 steps (5 full steps at each end, so window 5..8):
    # cadence:N runs step i full iff (i - 5) % N == 0
    for mode, window in (("cadence:2", "FCFC"), ("cadence:3", "FCCF")):
        res = runner.generate(runner.resolve(prompt="a lighthouse", seed=3, steps=steps, cache=mode))
        assert res.stats["schedule"] == "F" * 5 + window + "F" * 5, mode
    for mode in ("online-delta", f"calibrated:{calibrated}:0.01:step"):
        res = runner.generate(runner.resolve(prompt="a lighthouse", seed=3, steps=steps, cache=mode))
        sched = res.stats["schedule"]
        assert sched[:5] + sched[-5:] == "F" * 10 and res.stats["cached_steps"] == sched.count("C"), mode
    again = codegen(module, str(ckpt), tmp_path / "again", store=shared_store_dir(), log=lambda *_: None)
    assert again.compiled == [] and "probe" in again.reused
    assert _files(art) == before  # the served artifact is read, never rewritten
