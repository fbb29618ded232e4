"""CFG parallelism compiled and served: a `tp1+cfg2` artifact (two replicas of the TP1 denoiser
program, reused from the TP1 codegen: cfg group 0 = rank 0 runs the conditional pass, group 1 =
rank 1 the unconditional one at the same time; the family's own CFG formula on the host) serves the output of the same model's TP1 artifact, which runs the two
passes one after the other; so does qwen-image-tiny's `tp2+cfg2` (each group a compiled tp2 pair).

Oracle: the TP1 artifact in this process (ModelRunner, the code the model process runs) with the
same request. Each cfg group runs the very TP1 (tp2) program on one pass's inputs and the
host formula is shared, so outputs are identical up to kernel rounding: images by
oracle_util.images_close; videos per decoded MP4 frame >= 60 dB (H.264 may move a few pixels on a
one-level change). A negative prompt that does not reach the unconditional group would change the
output far beyond that (checked: a custom negative prompt moves the output). Artifacts are built
by the demo's own compile step on the session store, with the profiles' few steps and small sizes.
"""
from __future__ import annotations

import io

import numpy as np
import pytest

PROMPT, NEGATIVE, SEED = "a red fox in the snow", "blurry, low quality", 7
MODELS = ("qwen-image-tiny", "wan2.1-tiny", "ltx2-tiny")


@pytest.fixture(scope="module")
def arts(tmp_path_factory, difflet_test_store):
    """(model, parallel) -> ART, compiled on first use (programs from the store)."""
    from difflet.runtime.demo import compile_model, quiet_libraries

    quiet_libraries()
    root, built = tmp_path_factory.mktemp("cfg-arts"), {}

    def get(model: str, parallel: str):
        if (model, parallel) not in built:
            art = root / f"{model}-{parallel}"
            compile_model(model, art, difflet_test_store, parallel=parallel)
            built[model, parallel] = art
        return built[model, parallel]
    return get


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_cfg2_codegen_after_tp1_compiles_nothing_for_the_denoiser(arts, tmp_path, difflet_test_store, model):
    """A cfg2 denoiser's program is the TP1 one (same cache key): both groups load the TP1 store
    entry, and the artifact holds one program and one weights file for it."""
    from difflet.runtime.demo import compile_model

    arts(model, "tp1")  # the TP1 artifact: its denoiser program is in the store now
    result = compile_model(model, tmp_path / "art", difflet_test_store, parallel="tp1+cfg2")
    assert "transformer" in result.reused and "transformer" not in result.compiled
    entry = result.manifest.components["transformer"]
    assert (entry.cfg, entry.world) == (2, 1)
    assert sorted(p.name for p in (tmp_path / "art" / "weights").glob("transformer.*")) == \
        ["transformer.rank0.safetensors"]


def _frames(reply_or_result) -> np.ndarray:
    """An image [H, W, 3] from PNG bytes, or a video's decoded MP4 frames [F, H, W, 3]."""
    import av
    from PIL import Image

    mp4, png = reply_or_result.mp4, reply_or_result.png
    if not mp4:
        return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    with av.open(io.BytesIO(mp4)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    from oracle_util import describe_match, images_close, psnr

    assert got.shape == want.shape, what
    diff = int(np.abs(got.astype(int) - want.astype(int)).max())
    if got.ndim == 4:
        worst = min(psnr(a, b) for a, b in zip(got, want))
        print(f"{what}: worst frame {worst:.1f} dB, max pixel diff {diff}")
        assert worst >= 60, f"{what}: worst frame {worst:.1f} dB"
    else:
        print(f"{what}: {describe_match(got, want)}")
        assert images_close(got, want), f"{what}: {describe_match(got, want)}"


def _tp1_outputs(art, negatives) -> list[np.ndarray]:
    from difflet.runtime.runner import ModelRunner

    runner = ModelRunner.from_artifacts(art)
    try:
        return [_frames(runner.generate(runner.resolve(prompt=PROMPT, seed=SEED, negative_prompt=n)))
                for n in negatives]
    finally:
        runner.close()


@pytest.mark.slow
@pytest.mark.parametrize("model, parallel", [(m, "tp1+cfg2") for m in MODELS]
                         + [("qwen-image-tiny", "tp2+cfg2")])  # each cfg group a compiled tp2 pair
def test_cfg2_served_through_difflet_runtime_equals_the_tp1_output(arts, model, parallel):
    """The real server (difflet-runtime, its model process starting the cfg x inner rank
    workers) on the cfg2 artifact, over gRPC, with the family's default and a custom negative
    prompt."""
    from difflet.runtime import client
    from difflet.runtime.demo import launch_server, read_line, stop_server

    proc = launch_server(arts(model, parallel))
    try:
        read_line(proc, "model process 0 ready: ")
        address = read_line(proc, "listening on ")
        served = [_frames(client.generate(address, PROMPT, SEED, timeout=600, negative_prompt=n))
                  for n in (None, NEGATIVE)]
    finally:
        stop_server(proc)
    want = _tp1_outputs(arts(model, "tp1"), (None, NEGATIVE))
    for got, ref, what in zip(served, want, ("default negative prompt", f"negative prompt {NEGATIVE!r}")):
        _assert_same(got, ref, f"{model} {parallel} vs tp1, {what}")
    # the custom negative prompt reached the unconditional group: it changes the output
    assert not np.array_equal(served[0], served[1])


@pytest.mark.slow
def test_cfg2_runner_calls_the_denoiser_once_per_step_tp1_twice(arts):
    """Both passes in one program call per step under cfg2 (host/cfg.py), two calls under TP1."""
    from difflet.runtime.runner import ModelRunner

    counts, outputs = {}, {}
    for parallel in ("tp1", "tp1+cfg2"):
        runner = ModelRunner.from_artifacts(arts("qwen-image-tiny", parallel))
        try:
            program, calls = runner.env.programs["transformer"], []

            def counted(*args, _program=program, _calls=calls):
                _calls.append(len(args))
                return _program(*args)
            runner.env.programs["transformer"] = counted
            params = runner.resolve(prompt=PROMPT, seed=SEED, steps=3, negative_prompt=NEGATIVE)
            outputs[parallel] = _frames(runner.generate(params))
            counts[parallel] = calls
        finally:
            runner.close()
    assert counts["tp1"] == [4] * 6  # hidden_states, text, timestep, valid_text; cond + uncond per step
    assert counts["tp1+cfg2"] == [6] * 3  # + the negative prompt's text and valid_text twins
    _assert_same(outputs["tp1+cfg2"], outputs["tp1"], "qwen-image-tiny, 3 steps")
