"""Difflet's compiled flux-shapes pipeline generates FluxPipeline's images on the shipped weights.

Oracle: diffusers' stock FluxPipeline loaded from difflet/assets/flux-shapes (no Difflet code on
that side), called as the model card says (32x32, max_sequence_length=16, default 28 steps).
Difflet's side is models/flux-shapes.dsl lowered, optimized (tp1, cpu, inductor), codegen'd
against the same directory (programs from the session test store) and run through
ModelRunner.from_artifacts with the profile's defaults: the path difflet-runtime serves.
Closeness rule of tests/oracle_util.py (measured: identical, and max |diff| 1 at 83 dB); seed + 1,
true_cfg 1.5 (a negative prompt), scheduler shift + 2 and even 27 instead of 28 steps measured
10.7-12.2, 16.1-24.1, 41.8-48.0 and 53.1-54.5 dB with max |diff| >= 6: all fail it.
"""
from __future__ import annotations

import pytest

from difflet.train import generate, load_pipeline
from difflet.train.checker import check
from difflet.train.shapes_data import caption
from oracle_util import assert_images_close

# the demo's default prompt and seed, and a second shape/colour pair; both drawn correctly
CASES = [(("triangle", "yellow", "black"), 42), (("circle", "red", "blue"), 1)]


@pytest.fixture(scope="module")
def shapes_runner(difflet_test_store, tmp_path_factory):
    from difflet.runtime.demo import compile_model
    from difflet.runtime.runner import ModelRunner

    art = tmp_path_factory.mktemp("flux-shapes-art") / "art"
    compile_model("flux-shapes", art, difflet_test_store)
    runner = ModelRunner.from_artifacts(art)
    yield runner
    runner.close()


@pytest.mark.slow
def test_difflet_image_matches_fluxpipeline(shapes_runner):
    assert shapes_runner.profile["steps"] == 28 and shapes_runner.profile["max_text"] == 16
    pipe = load_pipeline()
    for spec, seed in CASES:
        prompt = caption(*spec)
        ours = shapes_runner.generate(shapes_runner.resolve(prompt=prompt, seed=seed)).image
        (ref,) = generate(pipe, [prompt], [seed])
        assert ours.shape == ref.shape == (32, 32, 3)
        assert_images_close(ours, ref, f"{prompt!r} seed {seed}")
        # the same image, so it must also be a correct one (not two equal failures)
        assert all(check(ours, *spec).values()), (prompt, seed, check(ours, *spec))


def test_guidance_mode_none_needs_a_transformer_without_guidance_input():
    """Mode "none" with a transformer that has a guidance input is refused, not run unguided."""
    from difflet.errors import DiffletError
    from difflet.ir.nodes import Op
    from difflet.families.flux import host as flux

    class Env:
        def component(self, name):
            return Comp()

    class Comp:
        def find(self, op):
            assert op is Op.INPUT
            return [type("N", (), {"name": "guidance"})()]

    class Step:
        args, loc = ("transformer",), "test"
        attrs = {"guidance": {"mode": "none"}}

    with pytest.raises(DiffletError, match="has guidance input"):
        flux.denoise(Env(), Step(), None)
