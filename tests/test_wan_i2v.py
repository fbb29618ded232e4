"""Wan 2.1 image-to-video (models/wan2.1-tiny-i2v.dsl) served equal to diffusers'
WanImageToVideoPipeline from the same random:0 checkpoint, input image, prompt, seed and steps, in
process (the Python API) and through a real difflet-runtime (gRPC and POST /v1/videos with the
`openai` package's `input_reference`, served lossless).

Oracles: the reference pipeline, called as its documented example calls it (the image already
at the output size, so its CLIPImageProcessor and VideoProcessor see the very pixels Difflet's
do), every frame under the closeness rule of tests/oracle_util.py, and its transformer calls
counted by a forward hook. Between the fronts of one server the frames must be identical: they
run the same programs on the same decoded pixels.
"""
from __future__ import annotations

import base64
import io

import av
import numpy as np
import openai
import pytest
import torch
from PIL import Image

from conftest import REPO
from difflet.runtime import client as grpc_client
from difflet.runtime.demo import stop_server
from http_util import call_json, start_http_server
from oracle_util import Counted, assert_images_close, compile_art, planned_tiny, random_checkpoint, wan_i2v_pipeline

# the variant's served oracles share one module fixture that compiles the family's tiny programs
# (~1-2.5 min of a worker): the full tier (CI) runs them, the quick tier stays under 10 minutes
pytestmark = pytest.mark.slow

PROMPT = "a red fox running through the snow"
SEED, STEPS, FRAMES, SIZE = 3, 4, 9, 32  # the tiny profile's frames and size


def png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, "PNG")
    return buf.getvalue()


_y, _x = np.mgrid[0:SIZE, 0:SIZE]
INPUT = png(np.stack([_x * 8, _y * 7, (_x * _y) % 256], -1).astype(np.uint8))
INPUT_2 = png(np.stack([255 - _y * 8, (_x * 3 + _y * 5) % 256, _x * 4], -1).astype(np.uint8))
# 56x40, not the served size: the VAE condition is resized to 32x32, CLIP's processor crops the original
_Y, _X = np.mgrid[0:40, 0:56]
INPUT_WIDE = png(np.stack([_X * 4, _Y * 6, (_X + 3 * _Y) % 256], -1).astype(np.uint8))


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    """(ART dir, checkpoint) of the tiny image-to-video description."""
    module = planned_tiny(REPO / "models" / "wan2.1-tiny-i2v.dsl")
    ckpt = random_checkpoint(module)
    return compile_art(module, ckpt, tmp_path_factory.mktemp("wan-i2v")), ckpt


def reference(ckpt, image: bytes = INPUT, calls: list | None = None) -> np.ndarray:
    """WanImageToVideoPipeline's uint8 frames [F, H, W, 3] (load_image input, as its docs call it)."""
    from diffusers.utils import load_image

    pipe = wan_i2v_pipeline(ckpt)
    if calls is not None:
        pipe.transformer.register_forward_hook(lambda *_: calls.append(1))
    frames = pipe(image=load_image(Image.open(io.BytesIO(image))), prompt=PROMPT, height=SIZE, width=SIZE,
                  num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=5.0, max_sequence_length=512,
                  generator=torch.Generator("cpu").manual_seed(SEED), output_type="np").frames[0]
    return (frames * 255).round().astype("uint8")


def test_python_api_equals_the_reference_pipeline_with_its_transformer_calls(art):
    from difflet import DiffletPipeline

    path, ckpt = art
    pipe = DiffletPipeline.from_artifacts(path)
    env = pipe.runner.env
    counts = {name: Counted(env.programs[name]) for name in ("transformer", "image_encoder", "vae_encoder")}
    env.programs.update(counts)
    outs = {}
    for image in (INPUT, INPUT_2, INPUT_WIDE):
        before = {n: c.calls for n, c in counts.items()}
        video = pipe(PROMPT, image=Image.open(io.BytesIO(image)), num_inference_steps=STEPS, seed=SEED,
                     output_type="np").frames[0]
        got = (np.stack(video) * 255).round().astype("uint8")
        calls: list = []
        ref = reference(ckpt, image, calls)
        assert got.shape == ref.shape == (FRAMES, SIZE, SIZE, 3)
        assert_images_close(got, ref, "wan i2v video")
        # true CFG: two transformer calls per step; one CLIP and one whole-clip VAE encode
        assert counts["transformer"].calls - before["transformer"] == len(calls) == 2 * STEPS
        assert {n: counts[n].calls - before[n] for n in ("image_encoder", "vae_encoder")} == \
            {"image_encoder": 1, "vae_encoder": 1}
        outs[image] = got
    # the image matters (not a vacuous match): another image, another video
    assert np.abs(outs[INPUT].astype(int) - outs[INPUT_2].astype(int)).mean() > 1
    pipe.close()


def decode(mp4: bytes) -> np.ndarray:
    with av.open(io.BytesIO(mp4)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])])


@pytest.fixture(scope="module")
def server(art):
    proc, grpc_address, http_address = start_http_server(art[0], "--lossless-video")
    yield grpc_address, http_address
    assert stop_server(proc) == 0


def _video(http_address: str, job_id: str) -> np.ndarray:
    from http_util import sse

    *_, last = sse(http_address, "GET", f"/v1/videos/{job_id}/events")  # waits for the end
    assert last["status"] == "completed", last
    oai = openai.OpenAI(base_url=f"http://{http_address}/v1", api_key="none-needed", max_retries=0)
    return decode(oai.videos.download_content(job_id).content)


def test_openai_videos_create_with_input_reference_equals_grpc_and_the_reference(server, art):
    """The openai package's multipart `input_reference` and a JSON data URL: the same frames
    as the gRPC reply for the same request (lossless MP4), and the reference's."""
    grpc_address, http_address = server
    oai = openai.OpenAI(base_url=f"http://{http_address}/v1", api_key="none-needed", max_retries=0)
    extra = {"seed": SEED, "num_inference_steps": STEPS}
    job = oai.videos.create(model="wan21_tiny_i2v", prompt=PROMPT, size=f"{SIZE}x{SIZE}",
                            input_reference=("in.png", INPUT, "image/png"), extra_body=extra)
    got = _video(http_address, job.id)
    reply = grpc_client.generate(grpc_address, PROMPT, SEED, steps=STEPS, image=INPUT, timeout=300)
    assert reply.denoiser_calls == STEPS  # steps that ran the denoiser (two CFG passes each: counted above)
    want = decode(reply.mp4)
    assert got.shape == (FRAMES, SIZE, SIZE, 3) and np.array_equal(got, want)
    assert_images_close(got, reference(art[1]), "served i2v video")
    url = "data:image/png;base64," + base64.b64encode(INPUT).decode()
    status, job = call_json(http_address, "POST", "/v1/videos", {"prompt": PROMPT, "input_reference": url, **extra})
    assert status == 200, job
    assert np.array_equal(_video(http_address, job["id"]), want)


def test_a_second_image_compiles_nothing_and_bad_references_are_refused_by_field(server):
    grpc_address, http_address = server
    reply = grpc_client.generate(grpc_address, PROMPT, SEED, steps=2, image=INPUT_2, timeout=300)
    assert decode(reply.mp4).shape == (FRAMES, SIZE, SIZE, 3)
    serving = grpc_client.get_profile(grpc_address, timeout=30).serving
    assert serving.processes and all(p.compiles == 0 for p in serving.processes)
    for value, says in (("https://example.com/a.png", "data URL"), ("data:image/png,abc", "base64"),
                        ("data:image/png;base64,!!", "damaged"), (None, "needs an input image"),
                        ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "")):
        body = {"prompt": PROMPT, **({} if value is None else {"input_reference": value})}
        status, err = call_json(http_address, "POST", "/v1/videos", body)
        assert status == 400 and err["error"]["param"] == "input_reference" and says in err["error"]["message"], err
