"""CFG parallelism compiled and served: a `tp1+cfg2` artifact (two replicas of the TP1 denoiser
program, reused from the TP1 codegen: cfg group 0 = rank 0 runs the conditional pass, group 1 =
rank 1 the unconditional one at the same time; the family's own CFG formula on the host), and
qwen-image-tiny's `tp2+cfg2` (each group a compiled tp2 pair), served through difflet-runtime.

Oracle: the family's diffusers pipeline (QwenImagePipeline, WanPipeline, LTX2Pipeline: the families
with a true CFG; FLUX and HunyuanVideo embed guidance in one pass) on the same checkpoint, prompt,
seed and negative prompt (pipeline_oracle.py), under oracle_util's closeness rule; videos are served
with --lossless-video, so the MP4's frames are the generated frames. A negative prompt that does not
reach the unconditional group changes the output far beyond the rule (checked: a custom negative
prompt moves the output). Artifacts are built by the demo's own compile step on the session store,
with the profiles' few steps and small sizes.
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


@pytest.mark.slow
@pytest.mark.parametrize("model, parallel", [(m, "tp1+cfg2") for m in MODELS]
                         + [("qwen-image-tiny", "tp2+cfg2")])  # each cfg group a compiled tp2 pair
def test_cfg2_served_through_difflet_runtime_equals_the_pipeline(arts, model, parallel):
    """The real server (difflet-runtime, its model process starting the cfg x inner rank
    workers) on the cfg2 artifact, over gRPC, with the family's default and a custom negative
    prompt."""
    from difflet.runtime import client
    from difflet.runtime.demo import launch_server, read_line, stop_server
    from oracle_util import assert_images_close
    from pipeline_oracle import pipeline_output

    proc = launch_server(arts(model, parallel), ("--lossless-video",))
    try:
        read_line(proc, "model process 0 ready: ")
        address = read_line(proc, "listening on ")
        served = [_frames(client.generate(address, PROMPT, SEED, timeout=600, negative_prompt=n))
                  for n in (None, NEGATIVE)]
    finally:
        stop_server(proc)
    for got, negative in zip(served, (None, NEGATIVE)):
        assert_images_close(got, pipeline_output(model, PROMPT, SEED, negative_prompt=negative),
                            f"{model} {parallel}, negative prompt {negative!r}, vs the pipeline")
    # the custom negative prompt reached the unconditional group: it changes the output
    assert not np.array_equal(served[0], served[1])


@pytest.mark.slow
def test_cfg2_runner_calls_the_denoiser_once_per_step_tp1_twice(arts):
    """Both passes in one program call per step under cfg2 (host/cfg.py), two calls under TP1."""
    from difflet.runtime.runner import ModelRunner
    from oracle_util import assert_images_close
    from pipeline_oracle import pipeline_output

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
    ref = pipeline_output("qwen-image-tiny", PROMPT, SEED, steps=3, negative_prompt=NEGATIVE)
    for parallel, got in outputs.items():
        assert_images_close(got, ref, f"qwen-image-tiny {parallel}, 3 steps, vs QwenImagePipeline")
