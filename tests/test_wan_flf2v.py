"""Wan 2.1 first-last-frame to video (models/wan2.1-tiny-flf2v.dsl: CLIP reads both images as a
batch of 2, the FLF2V transformer's image position embedding, the clip ending with the last image)
served equal to diffusers' WanImageToVideoPipeline called with `last_image` from the same random:0
checkpoint.

Oracles: the reference pipeline over that checkpoint with the same two images, prompt, seed and
steps, every frame under the closeness rule of tests/oracle_util.py (compiled vs eager fp32
programs); another last image moves the video past the rule, so the match could not hold with the
last frame dropped; the refusals name the field.
"""
from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import REPO
from oracle_util import (assert_images_close, compile_art, describe_match, planned_tiny, png, random_checkpoint,
                         wan_i2v_pipeline)

pytestmark = pytest.mark.slow  # the module fixture compiles the tiny programs (~2 min of a worker)

DSL = REPO / "models" / "wan2.1-tiny-flf2v.dsl"
PROMPT = "a red fox running through the snow"
SEED, SIZE, FRAMES, STEPS = 4, 32, 9, 3
_y, _x = np.mgrid[0:SIZE, 0:SIZE]
FIRST = np.stack([_x * 8, _y * 7, (_x * _y) % 256], -1).astype(np.uint8)
LAST = np.stack([255 - _y * 6, _x * 5, (_x + _y) * 4], -1).astype(np.uint8)


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    module = planned_tiny(DSL)
    ckpt = random_checkpoint(module)
    return compile_art(module, ckpt, tmp_path_factory.mktemp("wan-flf2v")), ckpt


@pytest.fixture(scope="module")
def reference_pipe(art):
    pipe = wan_i2v_pipeline(art[1])
    assert pipe.transformer.config.pos_embed_seq_len == 34 and pipe.image_encoder is not None
    return pipe


def reference(pipe, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    from diffusers.utils import load_image

    out = pipe(image=load_image(Image.open(io.BytesIO(png(first)))),
               last_image=load_image(Image.open(io.BytesIO(png(last)))), prompt=PROMPT, height=SIZE,
               width=SIZE, num_frames=FRAMES, num_inference_steps=STEPS, max_sequence_length=512,
               generator=torch.Generator("cpu").manual_seed(SEED), output_type="np")
    return (out.frames[0] * 255).round().astype(np.uint8)


@pytest.fixture(scope="module")
def pipe(art):
    from difflet import DiffletPipeline

    with DiffletPipeline.from_artifacts(art[0]) as p:
        yield p


def _served(pipe, first=FIRST, last=LAST) -> np.ndarray:
    frames = pipe(PROMPT, image=png(first), last_image=png(last), num_inference_steps=STEPS, seed=SEED,
                  output_type="np").frames[0]
    return (np.stack(frames) * 255).round().astype(np.uint8)


def test_served_equals_the_pipeline_with_the_last_frame(pipe, reference_pipe):
    """DiffletPipeline's `last_image=` as the reference takes it: every frame within the rule."""
    video, ref = _served(pipe), reference(reference_pipe, FIRST, LAST)
    print(f"wan2.1 flf2v, {STEPS} steps: {describe_match(video, ref)}")
    assert video.shape == ref.shape == (FRAMES, SIZE, SIZE, 3) and video.std() > 0
    assert_images_close(video, ref, what="wan2.1 flf2v")


def test_the_last_image_conditions_the_video(pipe):
    """Not a vacuous match: another last image moves the video past the closeness rule."""
    from oracle_util import images_close

    a, b = _served(pipe), _served(pipe, last=255 - LAST)
    assert not images_close(a, b), describe_match(a, b)


def test_one_image_is_refused_naming_the_field(pipe):
    from difflet.errors import DiffletError

    with pytest.raises(DiffletError) as err:
        pipe(PROMPT, image=png(FIRST), num_inference_steps=1, seed=SEED)
    assert err.value.where == "image" and "first and the last frame" in err.value.message
    with pytest.raises(DiffletError) as err:
        pipe(PROMPT, image=[png(FIRST), png(LAST)], last_image=png(LAST), num_inference_steps=1, seed=SEED)
    assert err.value.where == "last_image"


def test_the_checkpoint_names_the_description(art):
    from difflet.frontend.discover import description_for

    index = json.loads((art[1] / "model_index.json").read_text())
    assert index["_class_name"] == "WanImageToVideoPipeline"
    assert description_for(str(art[1])).name == "wan2.1-flf2v.dsl"


@pytest.fixture(scope="module")
def server(art):
    """(grpc address, http address) of one real server (--lossless-video) for the tests below; its
    warm-up request gives both images."""
    from difflet.runtime.demo import stop_server
    from http_util import start_http_server

    proc, grpc_address, http_address = start_http_server(art[0], "--lossless-video")
    yield grpc_address, http_address
    assert stop_server(proc) == 0


def _grpc_frames(grpc_address: str) -> np.ndarray:
    from difflet.runtime import client
    from difflet.runtime.media import decode_mp4

    reply = client.generate(grpc_address, PROMPT, SEED, steps=STEPS, image=[png(FIRST), png(LAST)], timeout=600)
    return decode_mp4(reply.mp4)[0]


def test_served_through_grpc_and_http_with_both_images(server, reference_pipe):
    """The two images of a gRPC request, in order, make the reference's frames, and POST /v1/videos
    with `input_reference` and `last_image` (data URLs) the gRPC reply's; one image is a 400 naming
    input_reference, a last image alone one naming last_image."""
    from difflet.runtime.media import decode_mp4
    from http_util import call, call_json, sse

    def url(array):
        return "data:image/png;base64," + base64.b64encode(png(array)).decode()

    grpc_address, http_address = server
    frames = _grpc_frames(grpc_address)
    assert_images_close(frames, reference(reference_pipe, FIRST, LAST), "served wan2.1 flf2v")
    body = {"prompt": PROMPT, "seed": SEED, "num_inference_steps": STEPS}
    status, job = call_json(http_address, "POST", "/v1/videos",
                            {**body, "input_reference": url(FIRST), "last_image": url(LAST)})
    assert status == 200, job
    *_, last = sse(http_address, "GET", f"/v1/videos/{job['id']}/events")
    assert last["status"] == "completed", last
    status, _, mp4 = call(http_address, "GET", f"/v1/videos/{job['id']}/content")
    assert status == 200 and np.array_equal(decode_mp4(mp4)[0], frames)
    status, err = call_json(http_address, "POST", "/v1/videos", {**body, "input_reference": url(FIRST)})
    assert status == 400 and err["error"]["param"] == "input_reference", err
    assert "last_image" in err["error"]["message"]
    status, err = call_json(http_address, "POST", "/v1/videos", {**body, "last_image": url(LAST)})
    assert status == 400 and err["error"]["param"] == "last_image", err


# the bytes of the video the page shows (its <video>'s blob URL), base64
SHOWN_VIDEO = """async () => {
    const bytes = new Uint8Array(await (await fetch(document.querySelector('#result').src)).arrayBuffer());
    let text = ''; for (const b of bytes) text += String.fromCharCode(b);
    return btoa(text); }"""


def test_the_playground_uploads_both_frames(server, page, tmp_path):
    """The playground at `/` in headless Chromium: a first-last-frame model shows the last-frame
    upload, sends both files as input_reference and last_image, and the video it shows is the
    gRPC reply's for the same prompt, seed and steps (lossless MP4, frame for frame)."""
    from difflet.runtime.media import decode_mp4

    grpc_address, http_address = server
    (tmp_path / "first.png").write_bytes(png(FIRST))
    (tmp_path / "last.png").write_bytes(png(LAST))
    page.set_default_timeout(300_000)
    page.goto(f"http://{http_address}/")
    page.wait_for_function("document.getElementById('size').options.length > 0")
    assert page.is_visible("#image") and page.is_visible("#last-image")
    page.fill("#prompt", PROMPT)
    page.fill("#steps", str(STEPS))
    page.fill("#seed", str(SEED))
    page.set_input_files("#image", str(tmp_path / "first.png"))
    page.set_input_files("#last-image", str(tmp_path / "last.png"))
    page.click("#generate")
    page.wait_for_selector("#result")
    shown = decode_mp4(base64.b64decode(page.evaluate(SHOWN_VIDEO)))[0]
    assert shown.shape == (FRAMES, SIZE, SIZE, 3) and np.array_equal(shown, _grpc_frames(grpc_address))
