"""The compiled probe program and step caching on a compiled flux-tiny ART (AOTInductor).

Oracles: the probe's score against the relative L1 change computed here from the checkpoint's
own diffusers modules (x_embedder, time_text_embed, first block's norm1); recompilation against
the store's compiled/reused report; determinism against the same request's earlier bytes.
One probe compile per run (into a fresh store seeded with the shared store's other programs).
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from difflet.cli import main
from difflet.ir.nodes import Op
from difflet.runtime.runner import ModelRunner


@pytest.fixture(scope="module")
def probe_module():
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize
    from tests.conftest import FLUX_TINY_DSL

    return optimize(lower_file(str(FLUX_TINY_DSL)), parallel="tp1", target="cpu", backend="inductor",
                    probe="separate")


@pytest.fixture(scope="module")
def probe_codegen(probe_module, flux_tiny_module, flux_tiny_ckpt, flux_tiny_art, difflet_test_store,
                  tmp_path_factory):
    """Codegen of the probe module into a store holding every program but the probe."""
    from difflet.codegen.driver import codegen
    from difflet.codegen.store import Store

    shared, fresh = Store(difflet_test_store), Store(tmp_path_factory.mktemp("store"))
    for comp in flux_tiny_module.components():
        src = shared.path("inductor", comp.attrs["cache_key"])
        dst = fresh.path("inductor", comp.attrs["cache_key"])
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst, copy_function=os.link)
    out = tmp_path_factory.mktemp("probe-art")
    first = codegen(probe_module, str(flux_tiny_ckpt), out, store=fresh.root, log=lambda *_: None)
    again = codegen(probe_module, str(flux_tiny_ckpt), tmp_path_factory.mktemp("probe-art2"),
                    store=fresh.root, log=lambda *_: None)
    return out, first, again


def test_adding_a_probe_compiles_only_the_probe(probe_module, flux_tiny_module, probe_codegen):
    _, first, again = probe_codegen
    keys = {c.name: c.attrs["cache_key"] for c in flux_tiny_module.components()}
    assert {c.name: c.attrs["cache_key"] for c in probe_module.components()} == keys
    assert first.compiled == ["probe"]
    assert sorted(first.reused) == sorted(keys)
    assert again.compiled == [] and "probe" in again.reused
    # the probe is an ordinary manifest entry with its role, its own key and the pruned signature
    name, entry = first.manifest.probe
    assert name == "probe" and entry.role == "probe" and entry.source == "transformer"
    assert list(first.manifest.components) == [*keys, "probe"]
    assert entry.cache_key == probe_module.find(Op.PROBE)[0].attrs["cache_key"]
    assert [v.name for v in entry.outputs] == ["score"]
    # the denoiser inputs the probe reads, in the IR's order (not the state input prev_feature)
    assert [v.name for v in entry.inputs] == ["hidden_states", "pooled_projections", "timestep", "guidance"]


def oracle_feature(ckpt, hidden, t, pooled, guidance):
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel.from_pretrained(str(ckpt), subfolder="transformer").eval()
    with torch.no_grad():
        temb = model.time_text_embed(t * 1000, guidance * 1000, pooled)
        return model.transformer_blocks[0].norm1(model.x_embedder(hidden), emb=temb)[0].double()


def test_compiled_probe_keeps_its_feature_between_calls(probe_codegen, flux_tiny_ckpt, probe_module):
    from difflet.codegen.artifacts import load_artifacts

    art = load_artifacts(probe_codegen[0])  # the same load path as every program
    assert sorted(art.programs) == sorted(c.name for c in probe_module.components())
    probe = art.probe
    gen = torch.Generator().manual_seed(0)
    pooled, guidance = torch.randn(1, 32, generator=gen), torch.tensor([3.5])
    a, b = torch.randn(1, 64, 16, generator=gen), torch.randn(1, 64, 16, generator=gen)
    ta, tb = torch.tensor([0.9]), torch.tensor([0.8])
    probe({"hidden_states": a, "timestep": ta, "pooled_projections": pooled, "guidance": guidance})
    got = probe({"hidden_states": b, "timestep": tb, "pooled_projections": pooled, "guidance": guidance})
    fa = oracle_feature(flux_tiny_ckpt, a, ta, pooled, guidance)
    fb = oracle_feature(flux_tiny_ckpt, b, tb, pooled, guidance)
    want = float((fb - fa).abs().mean() / fa.abs().mean())
    assert got == pytest.approx(want, rel=1e-4)
    # the same input twice: the saved feature is the one just computed, so the change is 0
    again = probe({"hidden_states": b, "timestep": tb, "pooled_projections": pooled, "guidance": guidance})
    assert again == pytest.approx(0.0, abs=1e-6)


@pytest.fixture(scope="module")
def compiled_runner(probe_codegen):
    return ModelRunner.from_artifacts(probe_codegen[0], cache="cadence:2")


@pytest.fixture(scope="module")
def cal_path(probe_codegen, tmp_path_factory):
    out = probe_codegen[0]
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts.write_text("# recording prompts\na cat\n\na house by a lake\nred stripes\n")
    cal = tmp_path_factory.mktemp("cal") / "cal.json"
    res = CliRunner().invoke(main, ["calibrate", str(out), "--prompts", str(prompts), "--steps", "20",
                                    "-o", str(cal)])
    assert res.exit_code == 0, res.output
    assert "R^2" in res.output and "wrote" in res.output
    return cal


def test_calibrate_cli_writes_a_tied_file(cal_path, probe_codegen):
    data = json.loads(cal_path.read_text())
    manifest = probe_codegen[1].manifest
    assert data["probe_cache_key"] == manifest.components["probe"].cache_key
    assert data["denoiser_weights_sha256"] == manifest.components["transformer"].ranks[0].weights.sha256
    assert data["selected"] in ("calibrated", "online-delta", "cadence") and data["mode"]


def test_calibrate_cli_errors_exit_2(probe_codegen, tmp_path):
    empty = tmp_path / "p.txt"
    empty.write_text("# nothing\n")
    res = CliRunner().invoke(main, ["calibrate", str(probe_codegen[0]), "--prompts", str(empty)])
    assert res.exit_code == 2 and "--prompts" in res.output
    res = CliRunner().invoke(main, ["calibrate", str(probe_codegen[0]), "--prompts", str(tmp_path / "none")])
    assert res.exit_code == 2 and "--prompts" in res.output
    empty.write_text("a cat\n")
    res = CliRunner().invoke(main, ["calibrate", str(probe_codegen[0]), "--prompts", str(empty), "--steps", "8"])
    assert res.exit_code == 2 and "--steps" in res.output


def test_compiled_requests_are_byte_identical_whatever_ran_before(compiled_runner, cal_path):
    r = compiled_runner
    assert r.probe is not None
    for mode in (None, f"calibrated:{cal_path}", f"calibrated:{cal_path}:0.05:step", "online-delta"):
        params = r.resolve(prompt="a lighthouse", seed=11, steps=20, cache=mode)
        first = r.generate(params)
        r.generate(r.resolve(prompt="something else", seed=5, steps=16, cache=f"calibrated:{cal_path}"))
        assert r.generate(params).png == first.png, mode  # same process and programs: exact
    default = r.generate(r.resolve(prompt="a lighthouse", seed=11, steps=20))
    assert default.stats["schedule"] == "FFFFF" + "FC" * 5 + "FFFFF"
    calibrated = r.generate(r.resolve(prompt="a lighthouse", seed=11, steps=20, cache=f"calibrated:{cal_path}"))
    assert calibrated.stats["probe_calls"] == 20 and np.isfinite(calibrated.stats["scores"][1:]).all()
