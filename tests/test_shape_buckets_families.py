"""A non-default shape bucket of each family besides FLUX and Wan (those are in
test_shape_buckets.py), served by the runner from one bucketed artifact.

Oracle: the family's diffusers pipeline called at the bucket's size on the same checkpoint, prompt
and seed (pipeline_oracle.py), under oracle_util's closeness rule. The default size's programs are
the single-size ones (same cache keys: reused from the store), so each case compiles only the
bucket's size-dependent programs (denoiser and decoder).
"""
from __future__ import annotations

import pytest

from conftest import REPO, shared_store_dir
from oracle_util import assert_images_close
from pipeline_oracle import checkpoint, pipeline_output

pytestmark = pytest.mark.slow  # compiles a denoiser and a decoder per family

PROMPT, SEED = "a red fox in the snow", 5


@pytest.mark.parametrize("model, shapes, size", [
    ("qwen-image-tiny", ["64x64", "32x32"], (32, 32, None)),  # Difflet's Qwen RoPE grid is square only
    ("hunyuan-video-tiny", ["32x32x5", "48x32x5"], (48, 32, 5)),
    ("ltx2-tiny", ["32x32x9", "64x32x9"], (64, 32, 9)),  # LTX2Pipeline takes multiples of 32 only
])
def test_a_non_default_bucket_equals_the_pipeline_at_that_size(tmp_path, model, shapes, size):
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.driver import codegen
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize
    from difflet.runtime.runner import ModelRunner

    planned = optimize(lower_file(str(REPO / "models" / f"{model}.dsl"), shapes=shapes))
    ckpt = resolve_weights(planned, "random:0", shared_store_dir())
    assert ckpt == checkpoint(model)  # the oracle's checkpoint: a bucket changes no weight
    codegen(planned, str(ckpt), tmp_path / "art", store=shared_store_dir(), log=lambda *_: None)
    width, height, frames = size
    with ModelRunner.from_artifacts(tmp_path / "art") as runner:
        request = dict(width=width, height=height) | ({"frames": frames} if frames else {})
        result = runner.generate(runner.resolve(prompt=PROMPT, seed=SEED, **request))
    got = result.video if frames else result.image
    assert got.shape[-3:] == (height, width, 3) and got.std() > 0
    ref = pipeline_output(model, PROMPT, SEED, height=height, width=width, frames=frames)
    assert_images_close(got, ref, f"{model} at {width}x{height} vs its pipeline")
