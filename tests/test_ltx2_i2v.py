"""LTX-2 image-to-video (models/ltx2-tiny-i2v.dsl) served equal to diffusers'
LTX2ImageToVideoPipeline from the same random:0 checkpoint, input file, prompt, seed and steps,
in process (the Python API).

Oracles: the reference pipeline, given the file as diffusers' `load_image` reads it (so its own
H.264 re-compression at its default CRF and its VideoProcessor run on it) and called as
tests/test_model_ltx2.py calls LTX2Pipeline (STG and modality guidance off: Difflet serves true
CFG + rescale). Every video frame under the closeness rule of tests/oracle_util.py; the waveform
(the vocoder program's output, what the MP4's audio track encodes) within the LTX-2 tests' ATOL;
its transformer evaluations counted by a forward hook (one batch-2 call per step there, two
batch-1 calls here); compiles counted at the entry points the model process counts.
"""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import REPO
from oracle_util import assert_images_close, compile_art, describe_match, planned_tiny, random_checkpoint

# the variant's served oracles share one module fixture that compiles the family's tiny programs
# (~1-2.5 min of a worker): the full tier (CI) runs them, the quick tier stays under 10 minutes
pytestmark = pytest.mark.slow

PROMPT = "a red fox running through the snow"
NEGATIVE = "blurry dark picture"
SEED, STEPS, FRAMES, SIZE = 3, 3, 9, 32  # the tiny profile's frames and size
ATOL = 1e-4  # tests/test_model_ltx2.py's bound on the waveform


def png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, "PNG")
    return buf.getvalue()


# 40x48 RGBA, not the served 32x32: the pipeline re-compresses the file as given, then resizes it
_y, _x = np.mgrid[0:48, 0:40]
INPUT = png(np.stack([_x * 6, _y * 5, (_x * _y) % 256, 255 - _y * 2], -1).astype(np.uint8))
_y2, _x2 = np.mgrid[0:SIZE, 0:SIZE]
INPUT_2 = png(np.stack([255 - _y2 * 8, (_x2 * 3 + _y2 * 5) % 256, _x2 * 4], -1).astype(np.uint8))


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    """(ART dir, checkpoint) of the tiny image-to-video description."""
    module = planned_tiny(REPO / "models" / "ltx2-tiny-i2v.dsl")
    ckpt = random_checkpoint(module)
    return compile_art(module, ckpt, tmp_path_factory.mktemp("ltx2-i2v")), ckpt


@pytest.fixture(scope="module")
def reference_pipe(art):
    from diffusers import LTX2ImageToVideoPipeline

    pipe = LTX2ImageToVideoPipeline.from_pretrained(str(art[1]))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference(pipe, image: bytes, seed: int, batches: list) -> tuple[np.ndarray, np.ndarray]:
    """The pipeline's (uint8 frames [F, H, W, 3], waveform [channels, samples]); `batches` gets
    the batch size of every transformer call."""
    from diffusers.utils import load_image

    hook = pipe.transformer.register_forward_hook(
        lambda _m, _a, kwargs, _o: batches.append(kwargs["hidden_states"].shape[0]), with_kwargs=True)
    try:
        out = pipe(image=load_image(Image.open(io.BytesIO(image))), prompt=PROMPT, negative_prompt=NEGATIVE,
                   height=SIZE, width=SIZE, num_frames=FRAMES, frame_rate=24.0, num_inference_steps=STEPS,
                   guidance_scale=3.0, max_sequence_length=16,
                   generator=torch.Generator("cpu").manual_seed(seed), output_type="np")
    finally:
        hook.remove()
    return (out.frames[0] * 255).round().astype("uint8"), out.audio[0].numpy()


class Recorded:
    """A program wrapper counting its calls and keeping its last outputs."""

    def __init__(self, program) -> None:
        self.program, self.calls, self.last = program, 0, None

    def __call__(self, *args, **kwargs):
        self.calls += 1
        self.last = self.program(*args, **kwargs)
        return self.last


def _compile_counter(monkeypatch) -> list[int]:
    """Count calls of the compile entry points the model process counts (model_process.py)."""
    import importlib

    from difflet.runtime.model_process import COMPILE_ENTRY_POINTS

    count = [0]
    for module_name, attr in COMPILE_ENTRY_POINTS:
        module = importlib.import_module(module_name)

        def counted(*args, __original=getattr(module, attr), **kwargs):
            count[0] += 1
            return __original(*args, **kwargs)
        monkeypatch.setattr(module, attr, counted)
    return count


def test_python_api_equals_the_reference_pipeline_frames_audio_and_transformer_calls(art, reference_pipe,
                                                                                     monkeypatch):
    from difflet import DiffletPipeline

    pipe = DiffletPipeline.from_artifacts(art[0])
    env = pipe.runner.env
    programs = {name: Recorded(env.programs[name]) for name in ("transformer", "vae_encoder", "vocoder")}
    env.programs.update(programs)
    compiles = _compile_counter(monkeypatch)  # after loading: the requests below must compile nothing
    outs = {}
    for image, seed in ((INPUT, SEED), (INPUT_2, SEED + 8)):
        before = {n: p.calls for n, p in programs.items()}
        video = pipe(PROMPT, NEGATIVE, image=Image.open(io.BytesIO(image)), num_inference_steps=STEPS,
                     seed=seed, output_type="np").frames[0]
        got = (np.stack(video) * 255).round().astype("uint8")
        wave = programs["vocoder"].last[0][0].numpy()
        batches: list = []
        ref_video, ref_wave = reference(reference_pipe, image, seed, batches)
        assert got.shape == ref_video.shape == (FRAMES, SIZE, SIZE, 3) and got.std() > 0
        print(f"ltx2 i2v video vs LTX2ImageToVideoPipeline: {describe_match(got, ref_video)}; "
              f"waveform max |diff| {np.abs(wave - ref_wave).max():.2e}")
        assert_images_close(got, ref_video, "ltx2 i2v video")
        assert wave.shape == ref_wave.shape and np.abs(wave - ref_wave).max() <= ATOL
        # per step the pipeline calls batch 2 (CFG), then its STG pass, then the isolated pass;
        # here CFG is two batch-1 calls and the STG pass is skipped: without perturbed_attn it
        # computes the conditional pass again (families/ltx2/guidance.py); one VAE encode
        assert batches == [2, 1, 1] * STEPS
        assert programs["transformer"].calls - before["transformer"] == sum(batches) - STEPS
        assert programs["vae_encoder"].calls - before["vae_encoder"] == 1
        outs[image] = got
    assert compiles[0] == 0  # the second, different image (and size) compiled nothing
    # the image matters (not a vacuous match): another image, another video, from its first frame on
    assert np.abs(outs[INPUT][0].astype(int) - outs[INPUT_2][0].astype(int)).mean() > 1
    pipe.close()


def test_the_first_latent_frame_is_the_image_and_its_timestep_is_zero(art):
    """The conditioning as LTX2ImageToVideoPipeline.prepare_latents and its loop make it, checked
    on the host values directly: latent frame 0's tokens are the encoder's normalized latents at
    the start and after the last step, and its tokens' video timestep is 0 at every call."""
    from difflet import DiffletPipeline
    from difflet.ir.nodes import Op

    pipe = DiffletPipeline.from_artifacts(art[0])
    env = pipe.runner.env
    seen: list = []
    transformer = env.programs["transformer"]
    at = [n.name for n in env.component("transformer").find(Op.INPUT)].index("video_timestep")

    def spy(*args):  # programs take the IR inputs positionally
        seen.append(args[at].clone())
        return transformer(*args)
    env.programs["transformer"] = spy
    state, _ = pipe.runner._run(pipe.runner.resolve(prompt=PROMPT, seed=SEED, steps=STEPS, image=INPUT))
    tokens = 4 * 4  # latent frame 0 of 32x32 at 8x spatial, patch 1
    first = state.values["image_latents"][0, :, 0].flatten(1).T  # [tokens, channels]
    assert torch.equal(state.values["video_latents"][0, :tokens], first)
    assert len(seen) == 3 * STEPS and all((t[0, :tokens] == 0).all() and (t[0, tokens:] > 0).all() for t in seen)
    pipe.close()


@pytest.mark.slow  # compiles the two-rank programs
def test_context_parallel_serving_equals_the_reference_pipeline(art, reference_pipe, tmp_path):
    """Image-to-video under a split layout: cp2 (Ulysses) cuts the video tokens across the two
    ranks, so the per-token `video_timestep` (0 on the image's latent frame) must be cut with
    them; a rank given the whole vector, or another rank's half, moves frame 0 far past the rule."""
    from difflet import DiffletPipeline
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    module = optimize(lower_file(str(REPO / "models" / "ltx2-tiny-i2v.dsl")), parallel="cp2", attention="ulysses",
                      target="cpu", backend="inductor")
    assert str(random_checkpoint(module)) == str(art[1])  # the same random:0 weights as the reference's
    with DiffletPipeline.from_artifacts(compile_art(module, art[1], tmp_path / "cp2")) as pipe:
        assert pipe.runner.module.attrs["parallel"]["world"] == 2
        video = pipe(PROMPT, NEGATIVE, image=INPUT, num_inference_steps=STEPS, seed=SEED, output_type="np").frames[0]
    got = (np.stack(video) * 255).round().astype("uint8")
    ref_video, _ = reference(reference_pipe, INPUT, SEED, [])
    print(f"ltx2 i2v cp2 ulysses vs LTX2ImageToVideoPipeline: {describe_match(got, ref_video)}")
    assert_images_close(got, ref_video, "ltx2 i2v cp2 ulysses")
