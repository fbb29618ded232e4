"""Shape buckets: one flux-tiny artifact serving 32x32, 48x32 and 32x48.

Oracle: the single-size artifact of each size (lowered with --profile width=,height=). A bucket's
programs have the single-size programs' cache keys, so they are the same compiled files run on
the same weights: outputs must be identical, not merely close. Each size's output is also held to
the diffusers pipeline at that size (pipeline_oracle.py) by oracle_util's closeness rule.
"""
from __future__ import annotations

import io
from pathlib import Path

import grpc
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from conftest import shared_store_dir
from difflet.cli import main
from difflet.codegen.driver import codegen
from difflet.frontend.lower import lower_file
from difflet.ir.buckets import merge, view, views
from difflet.ir.text import parse_module, print_module
from difflet.passes.pipeline import optimize
from oracle_util import assert_images_close
from pipeline_oracle import checkpoint, pipeline_output

pytestmark = pytest.mark.slow  # compiles whole split / bucketed / bf16 models: full suite only

REPO = Path(__file__).resolve().parent.parent
DSL = str(REPO / "models" / "flux-tiny.dsl")
SIZES = ["32x32", "48x32", "32x48"]


def _single(size: str):
    w, h = size.split("x")
    return optimize(lower_file(DSL, {"width": w, "height": h}))


@pytest.fixture(scope="module")
def planned():
    return optimize(lower_file(DSL, shapes=SIZES))


@pytest.fixture(scope="module")
def art(planned, flux_tiny_ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("buckets") / "art"
    result = codegen(planned, str(flux_tiny_ckpt), out, store=shared_store_dir(), log=lambda *_: None)
    return out, result


@pytest.fixture(scope="module")
def runner(art):
    from difflet.runtime.runner import ModelRunner

    with ModelRunner.from_artifacts(art[0]) as r:
        yield r


def test_views_are_the_single_size_modules(planned):
    """Every size-dependent component is per size, the encoders once; each view is exactly the
    module planned at that size alone (so its programs are the single-size programs)."""
    names = [c.name for c in planned.components()]
    assert names == ["text_encoder", "text_encoder_2", *(f"transformer@{s}" for s in SIZES),
                     *(f"vae@{s}" for s in SIZES)]
    for size, v in views(planned):
        assert v == _single(size)
    assert parse_module(print_module(planned), "buckets") == planned


def test_merge_refuses_what_depends_on_the_size():
    a = lower_file(DSL)
    b = lower_file(DSL, {"steps": "3", "width": "48"})  # the step runtime value's range differs too
    with pytest.raises(Exception, match="depends on the size"):
        merge([a, b])
    with pytest.raises(Exception, match="size 32x32 is listed twice"):
        merge([a, a])
    with pytest.raises(Exception, match=r"size 64x64 is not served \(sizes: 32x32, 48x32\)"):
        view(merge([a, lower_file(DSL, {"width": "48"})]), "64x64")


def test_bad_shapes_argument_is_a_usage_error():
    r = CliRunner().invoke(main, ["lower", DSL, "--shapes", "32x32,48by32"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "size '48by32' is not WxH (width x height)" in r.stderr


def test_each_size_equals_its_single_size_artifact(runner, flux_tiny_ckpt, tmp_path):
    from difflet.runtime.runner import ModelRunner

    for size in SIZES:
        w, h = (int(x) for x in size.split("x"))
        ours = runner.generate(runner.resolve(prompt="a red fox", seed=3, width=w, height=h)).image
        single = tmp_path / size
        codegen(_single(size), str(flux_tiny_ckpt), single, store=shared_store_dir(), log=lambda *_: None)
        with ModelRunner.from_artifacts(single) as alone:
            ref = alone.generate(alone.resolve(prompt="a red fox", seed=3)).image
        assert ours.shape == (h, w, 3)
        assert np.array_equal(ours, ref), size  # same program files, same weights, same inputs
        assert_images_close(ours, pipeline_output("flux-tiny", "a red fox", 3, height=h, width=w),
                            f"{size} vs FluxPipeline")


def test_sizes_share_one_copy_of_each_weight(runner, art):
    """The transformer's checkpoint tensors are one set of tensors behind all three programs."""
    from safetensors import safe_open

    with safe_open(str(art[0] / "weights" / "transformer.rank0.safetensors"), "pt") as f:
        shared = list(f.keys())
    by_size = [env.programs["transformer"]._runner._constants for env in runner.envs.values()]
    assert len(shared) > 10 and len(by_size) == 3
    for name in shared:
        assert len({c[name].data_ptr() for c in by_size}) == 1, name
    assert runner.envs["32x32"].programs["text_encoder"] is runner.envs["48x32"].programs["text_encoder"]


def test_a_fourth_bucket_compiles_only_its_size_dependent_programs(art, flux_tiny_ckpt, tmp_path):
    _, first = art
    more = optimize(lower_file(DSL, shapes=[*SIZES, "64x32"]))
    lines = []
    result = codegen(more, str(flux_tiny_ckpt), tmp_path / "art4", store=shared_store_dir(), log=lines.append)
    assert set(result.compiled) <= {"transformer@64x32", "vae@64x32"}  # (reused if an earlier run made them)
    assert sorted(set(result.reused) - {"transformer@64x32", "vae@64x32"}) == sorted(first.compiled + first.reused)
    assert result.manifest.buckets == (*SIZES, "64x32")


def test_served_sizes_are_listed_and_picked_per_request(art):
    """gRPC and HTTP list the sizes; a request picks one; an unserved size is refused naming them."""
    import base64

    from difflet.runtime import client
    from difflet.runtime.demo import stop_server
    from http_util import call_json, start_http_server

    proc, address, http_address = start_http_server(art[0])
    try:
        profile = client.get_profile(address)
        assert list(profile.sizes) == SIZES and (profile.width, profile.height) == (32, 32)
        assert list(profile.components) == ["text_encoder", "text_encoder_2", "transformer", "vae"]
        reply = client.generate(address, "a blue square", 1, width=48, height=32, timeout=300)
        assert (reply.width, reply.height) == (48, 32)
        assert Image.open(io.BytesIO(reply.png)).size == (48, 32)
        with pytest.raises(grpc.RpcError) as err:
            client.generate(address, "a blue square", 1, width=64, height=64, timeout=300)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == ("width: 64x64 (width x height) is not a served size; "
                                       "served: 32x32, 48x32, 32x48")

        status, models = call_json(http_address, "GET", "/v1/models")
        assert status == 200 and models["data"][0]["sizes"] == SIZES
        status, body = call_json(http_address, "POST", "/v1/images/generations",
                                 {"prompt": "a blue square", "size": "32x48", "seed": 1})
        assert status == 200, body
        assert Image.open(io.BytesIO(base64.b64decode(body["data"][0]["b64_json"]))).size == (32, 48)
        status, body = call_json(http_address, "POST", "/v1/images/generations",
                                 {"prompt": "a blue square", "size": "64x64"})
        assert status == 400 and body["error"]["param"] == "size"
        assert body["error"]["message"] == ("size: 64x64 is not served: sizes are compiled in, this server "
                                            "serves 32x32, 48x32, 32x48")
    finally:
        assert stop_server(proc) == 0


def test_sizes_listed_in_the_description_profile(tmp_path):
    text = Path(DSL).read_text().replace("    dtype    = float32\n", '    dtype    = float32\n    shapes = "32x32,48x32"\n', 1)
    assert 'shapes = "32x32,48x32"' in text
    (tmp_path / "m.dsl").write_text(text)
    from difflet.ir.buckets import buckets

    assert buckets(lower_file(str(tmp_path / "m.dsl"))) == ("32x32", "48x32")
    assert buckets(lower_file(str(tmp_path / "m.dsl"), shapes=["32x48"])) == ("32x48",)  # --shapes wins


def test_video_buckets_over_frame_count(tmp_path):
    """wan2.1-tiny at 9 and 5 frames: only the transformer depends on the clip length (the VAE
    decodes one latent frame per call); a request picks its frame count."""
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.errors import DiffletError
    from difflet.runtime.runner import ModelRunner

    wan = str(REPO / "models" / "wan2.1-tiny.dsl")
    planned = optimize(lower_file(wan, shapes=["32x32x9", "32x32x5"]))
    assert [c.name for c in planned.components()] == ["text_encoder", "transformer@32x32x9",
                                                      "transformer@32x32x5", "vae"]
    ckpt = resolve_weights(planned, "random:0", shared_store_dir())
    codegen(planned, str(ckpt), tmp_path / "art", store=shared_store_dir(), log=lambda *_: None)
    five = optimize(lower_file(wan, {"frames": "5"}))
    codegen(five, str(ckpt), tmp_path / "five", store=shared_store_dir(), log=lambda *_: None)
    with ModelRunner.from_artifacts(tmp_path / "art") as runner, ModelRunner.from_artifacts(tmp_path / "five") as alone:
        ours = runner.generate(runner.resolve(prompt="a fox", seed=2, steps=2, frames=5)).video
        ref = alone.generate(alone.resolve(prompt="a fox", seed=2, steps=2)).video
        assert ours.shape == (5, 32, 32, 3) and np.array_equal(ours, ref)
        assert ckpt == checkpoint("wan2.1-tiny")  # the oracle's: buckets change no weight
        assert_images_close(ours, pipeline_output("wan2.1-tiny", "a fox", 2, steps=2, frames=5),
                            "5 frames vs WanPipeline")
        assert runner.generate(runner.resolve(prompt="a fox", seed=2, steps=1)).video.shape[0] == 9
        with pytest.raises(DiffletError) as err:
            runner.resolve(prompt="a fox", seed=2, frames=7)
        assert (err.value.where, err.value.message) == ("frames", "frames: 7 frames are not served at 32x32 "
                                                                  "(served: 9, 5)")
