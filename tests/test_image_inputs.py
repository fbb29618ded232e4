"""Image inputs on FLUX (issue 29): image-to-image and inpainting served equal to diffusers'
FluxImg2ImgPipeline / FluxInpaintPipeline from the same checkpoint, input file, mask, strength,
prompt, seed and steps, in-process (the Python API) and through a real difflet-runtime (gRPC,
the HTTP edits route with the `openai` package, `difflet generate`).

Oracles: the reference pipelines, given the file as diffusers' `load_image` reads it and the
request's size, under the closeness rule of tests/oracle_util.py (compiled programs vs eager
diffusers: the rule's bound is what two float programs may differ by; a wrong strength, mask or
latent sample moves many pixels by far more). Between the fronts of one server the PNG bytes must
be identical: they run the same programs on the same decoded pixels.
"""
from __future__ import annotations

import base64
import io
import subprocess
import sys

import grpc
import numpy as np
import openai
import pytest
import torch
from PIL import Image

from conftest import REPO
from difflet.runtime import client as grpc_client
from difflet.runtime.demo import stop_server
from http_util import call_json, start_http_server
from oracle_util import Counted, assert_images_close, compile_art, planned_tiny, random_checkpoint

PROMPT = "a red fox in the snow"
SEED, STEPS = 3, 5


def png(array: np.ndarray, mode: str | None = None) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array, mode).save(buf, "PNG")
    return buf.getvalue()


# 40x48 RGBA, not the served 32x32: the API process must resize (lanczos) and drop alpha exactly
# as VaeImageProcessor does for the reference pipeline
_y, _x = np.mgrid[0:48, 0:40]
INPUT = png(np.stack([_x * 6, _y * 5, (_x * _y) % 256, 255 - _y * 2], -1).astype(np.uint8))
MASK = png(np.where((_x > 8) & (_x < 30) & (_y > 10) & (_y < 36), 255, 0).astype(np.uint8))
MASK_2 = png(np.where(_x < 20, 255, 0).astype(np.uint8))
KONTEXT_SIZES = ["32x32", "48x32"]


# profile -> (description, reference pipeline class, its profile: size, guidance call arguments)
PROFILES = {
    "img2img": ("flux-tiny-img2img", "FluxImg2ImgPipeline", 32, dict(guidance_scale=3.5, max_sequence_length=32)),
    "inpaint": ("flux-tiny-inpaint", "FluxInpaintPipeline", 32, dict(guidance_scale=3.5, max_sequence_length=32)),
    "qwen-img2img": ("qwen-image-tiny-img2img", "QwenImageImg2ImgPipeline", 64,
                     dict(true_cfg_scale=4.0, negative_prompt=" ", max_sequence_length=16)),
    "qwen-inpaint": ("qwen-image-tiny-inpaint", "QwenImageInpaintPipeline", 64,
                     dict(true_cfg_scale=4.0, negative_prompt=" ", max_sequence_length=16)),
}


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
    """profile -> (ART dir, checkpoint), compiled on first use."""
    out = {}

    def get(mode):
        if mode not in out:
            dsl = "flux-tiny-kontext" if mode == "kontext" else PROFILES[mode][0]
            # Kontext compiles its input image at the output size: two buckets, two input sizes
            module = planned_tiny(REPO / "models" / f"{dsl}.dsl", KONTEXT_SIZES if mode == "kontext" else None)
            ckpt = random_checkpoint(module)
            out[mode] = (compile_art(module, ckpt, tmp_path_factory.mktemp(mode)), ckpt)
        return out[mode]

    return get


def reference(mode: str, ckpt, strength: float, image: bytes = INPUT, mask: bytes = MASK,
              calls: list | None = None, steps: int = STEPS) -> np.ndarray:
    """The diffusers pipeline's uint8 image, called as its docs call it (load_image inputs);
    `calls` gets one entry per transformer call."""
    import diffusers
    from diffusers.utils import load_image

    _, cls, size, call = PROFILES[mode]
    pipe = getattr(diffusers, cls).from_pretrained(str(ckpt))
    pipe.set_progress_bar_config(disable=True)
    if calls is not None:
        pipe.transformer.register_forward_hook(lambda *_: calls.append(1))
    extra = {"mask_image": load_image(Image.open(io.BytesIO(mask)))} if mode.endswith("inpaint") else {}
    out = pipe(prompt=PROMPT, image=load_image(Image.open(io.BytesIO(image))), strength=strength,
               num_inference_steps=steps, height=size, width=size,
               generator=torch.Generator("cpu").manual_seed(SEED), output_type="np", **call, **extra).images[0]
    return (out * 255).round().astype("uint8")


@pytest.mark.parametrize("mode", list(PROFILES))
def test_python_api_equals_the_reference_pipeline_at_two_strengths_with_reference_call_counts(arts, mode):
    from difflet import DiffletPipeline

    art, ckpt = arts(mode)
    pipe = DiffletPipeline.from_artifacts(art)
    env = pipe.runner.env
    counts = {name: Counted(env.programs[name]) for name in ("transformer", "vae_encoder")}
    env.programs.update(counts)
    mask = {"mask_image": Image.open(io.BytesIO(MASK))} if mode.endswith("inpaint") else {}
    passes = 2 if mode.startswith("qwen") else 1  # true CFG: two transformer calls per step
    for strength, steps in ((0.6, STEPS), (1.0, STEPS), (0.6, 7)):  # 7 x 0.6 = 4.2: the pipeline runs 5
        before = {n: c.calls for n, c in counts.items()}
        out = pipe(PROMPT, image=Image.open(io.BytesIO(INPUT)), strength=strength, num_inference_steps=steps,
                   seed=SEED, output_type="np", **mask)
        got = (out.images[0] * 255).round().astype("uint8")
        calls: list = []
        assert_images_close(got, reference(mode, ckpt, strength, calls=calls, steps=steps),
                            f"{mode} strength {strength}")
        # the pipeline's get_timesteps: the last steps - int(steps - steps x strength); one VAE encode
        run = steps - int(steps - steps * strength)
        assert counts["transformer"].calls - before["transformer"] == len(calls) == passes * run
        assert counts["vae_encoder"].calls - before["vae_encoder"] == 1
    pipe.close()


def test_kontext_editing_equals_the_reference_at_each_input_size_and_refuses_one_it_does_not_serve(arts):
    """FLUX.1 Kontext: the image's latents join the visual tokens at every step, compiled at the
    output size of each shape bucket (`image_width = width`), so a request without a size takes
    the size the pipeline gives its image. The reference runs with _auto_resize=False, what the
    tiny profile declares (the preferred resolutions are ~1 MP), height/width = that size and
    max_area = its area (the default, 1024^2, would resize a tiny output)."""
    import diffusers
    from diffusers.utils import load_image

    from difflet import DiffletPipeline
    from difflet.errors import DiffletError

    art, ckpt = arts("kontext")
    pipe = DiffletPipeline.from_artifacts(art)
    counts = {size: Counted(env.programs["transformer"]) for size, env in pipe.runner.envs.items()}
    for size, env in pipe.runner.envs.items():
        env.programs["transformer"] = counts[size]
    ref_pipe = diffusers.FluxKontextPipeline.from_pretrained(str(ckpt))
    ref_pipe.set_progress_bar_config(disable=True)
    calls: list = []
    ref_pipe.transformer.register_forward_hook(lambda *_: calls.append(1))

    def reference_edit(image: bytes, width: int, height: int) -> np.ndarray:
        out = ref_pipe(image=load_image(Image.open(io.BytesIO(image))), prompt=PROMPT, guidance_scale=3.5,
                       height=height, width=width, max_area=width * height, _auto_resize=False,
                       num_inference_steps=STEPS, max_sequence_length=32,
                       generator=torch.Generator("cpu").manual_seed(SEED), output_type="np").images[0]
        return (out * 255).round().astype("uint8")

    # 35x34: floored to the pipeline's multiple of 4 it is 32x32, resized (lanczos) to it;
    # 50x33 floors to 48x32, the other bucket: the output takes each image's size
    source = png(np.stack([_x[:34, :35] * 7, _y[:34, :35] * 7, (_x * _y)[:34, :35] % 256], -1).astype(np.uint8))
    wide = png(np.asarray(Image.open(io.BytesIO(source)).resize((50, 33), Image.Resampling.BICUBIC)))
    got = np.asarray(pipe(PROMPT, image=source, num_inference_steps=STEPS, seed=SEED).images[0])
    assert got.shape == (32, 32, 3)
    assert_images_close(got, reference_edit(source, 32, 32), "kontext 32x32")
    assert counts["32x32"].calls == len(calls) == STEPS
    edited = np.asarray(pipe(PROMPT, image=wide, num_inference_steps=STEPS, seed=SEED).images[0])
    assert edited.shape == (32, 48, 3)
    assert_images_close(edited, reference_edit(wide, 48, 32), "kontext 48x32")
    assert counts["48x32"].calls == STEPS  # the 48x32 bucket's own program, loaded from the artifact
    # another image changes the edit (its tokens are read: on random tiny weights only slightly,
    # so the new output is held to the reference's for that image)
    square = png(np.asarray(Image.open(io.BytesIO(INPUT)).convert("RGB"))[:32, :32].copy())
    moved = np.asarray(pipe(PROMPT, image=square, num_inference_steps=STEPS, seed=SEED).images[0])
    assert not np.array_equal(moved, got)
    assert_images_close(moved, reference_edit(square, 32, 32), "kontext, another image")
    # refused before anything runs: an image the pipeline sizes to 40x48 (no such bucket), and
    # a 48x32 one asked for a 32x32 output (its tokens are compiled at the output size)
    before = {size: c.calls for size, c in counts.items()}
    with pytest.raises(DiffletError) as err:
        pipe(PROMPT, image=INPUT, num_inference_steps=STEPS, seed=SEED)
    assert err.value.where == "image" and "sizes this 40x48 image to 40x48" in err.value.message
    assert "does not serve (served: 32x32, 48x32)" in err.value.message
    with pytest.raises(DiffletError) as err:
        pipe(PROMPT, image=wide, height=32, width=32, num_inference_steps=STEPS, seed=SEED)
    assert err.value.where == "image" and "compiles the input image at the output size, 32x32" in err.value.message
    assert {size: c.calls for size, c in counts.items()} == before
    pipe.close()


def test_the_strength_and_the_mask_change_the_output(arts):
    """Guards against a vacuous match: strength and mask must matter, as in the reference."""
    from difflet import DiffletPipeline

    pipe = DiffletPipeline.from_artifacts(arts("inpaint")[0])

    def run(strength, mask):
        return np.asarray(pipe(PROMPT, image=INPUT, mask_image=mask, strength=strength, num_inference_steps=STEPS,
                               seed=SEED).images[0]).astype(int)
    low, high, other = run(0.4, MASK), run(1.0, MASK), run(1.0, MASK_2)
    assert np.abs(low - high).mean() > 2 and np.abs(high - other).mean() > 2
    pipe.close()


@pytest.fixture(scope="module")
def server(arts):
    proc, grpc_address, http_address = start_http_server(arts("inpaint")[0])
    yield grpc_address, http_address
    assert stop_server(proc) == 0


def test_openai_images_edit_equals_the_grpc_reply_and_the_reference(server, arts):
    grpc_address, http_address = server
    oai = openai.OpenAI(base_url=f"http://{http_address}/v1", api_key="none-needed", max_retries=0)
    reply = oai.images.edit(image=("fox.png", INPUT, "image/png"), mask=("mask.png", MASK, "image/png"),
                            prompt=PROMPT, size="32x32", response_format="b64_json",
                            extra_body={"seed": SEED, "num_inference_steps": STEPS, "strength": 0.6})
    edited = base64.b64decode(reply.data[0].b64_json)
    grpc_reply = grpc_client.generate(grpc_address, PROMPT, SEED, steps=STEPS, strength=0.6, image=INPUT,
                                      mask_image=MASK, timeout=300)
    assert edited == grpc_reply.png
    assert grpc_reply.denoiser_calls == STEPS - int(STEPS - STEPS * 0.6)
    got = np.asarray(Image.open(io.BytesIO(edited)).convert("RGB"))
    assert_images_close(got, reference("inpaint", arts("inpaint")[1], 0.6))


def test_changing_image_mask_and_strength_compiles_nothing(server):
    grpc_address, _ = server
    jpeg = io.BytesIO()
    Image.open(io.BytesIO(INPUT)).convert("RGB").save(jpeg, "JPEG")
    for image, mask, strength in ((INPUT, MASK, 0.3), (jpeg.getvalue(), MASK_2, 0.9), (INPUT, MASK_2, 1.0)):
        grpc_client.generate(grpc_address, PROMPT, SEED, steps=2, strength=strength, image=image,
                             mask_image=mask, timeout=300)
    serving = grpc_client.get_profile(grpc_address, timeout=30).serving
    assert serving.processes and all(p.compiles == 0 for p in serving.processes)


def test_difflet_generate_with_image_and_mask_writes_the_grpc_reply(server, tmp_path):
    grpc_address, _ = server
    (tmp_path / "in.png").write_bytes(INPUT)
    (tmp_path / "mask.png").write_bytes(MASK)
    out = tmp_path / "out.png"
    proc = subprocess.run([sys.executable, "-m", "difflet.cli", "generate", PROMPT, "--server", grpc_address,
                           "-o", str(out), "--image", str(tmp_path / "in.png"), "--mask", str(tmp_path / "mask.png"),
                           "--strength", "0.6", "--steps", str(STEPS), "--seed", str(SEED)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == grpc_client.generate(grpc_address, PROMPT, SEED, steps=STEPS, strength=0.6,
                                                    image=INPUT, mask_image=MASK, timeout=300).png


def _big_png() -> bytes:
    return png(np.zeros((2049, 2049), np.uint8))  # 4.2 MP, over the 4 MP default bound; a few KB


def _gif() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (32, 32)).save(buf, "GIF")
    return buf.getvalue()


BAD = [  # (image, mask, strength, field, words in the message)
    (b"not an image at all", MASK, None, "image", "is not an image"),
    (_gif(), MASK, None, "image", "GIF is not a supported format"),
    (INPUT[: len(INPUT) // 2], MASK, None, "image", "damaged"),
    (_big_png(), MASK, None, "image", "over the bound"),
    (INPUT, png(np.zeros((10, 10), np.uint8)), None, "mask_image", "does not match the image's 40x48"),
    (INPUT, MASK, 0.0, "strength", "(0, 1]"),
    (INPUT, MASK, 1.5, "strength", "(0, 1]"),
    (INPUT, None, None, "mask_image", "needs a mask"),
    (None, MASK, None, "image", "needs an input image"),
]


BOUNDARY = "difflet-test-boundary"


def multipart(parts) -> bytes:
    """A multipart/form-data body of (name, filename or None, bytes) parts, as HTTP clients send."""
    out = b""
    for name, filename, data in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        kind = "Content-Type: application/octet-stream\r\n" if filename else ""
        out += f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n{kind}\r\n".encode() + data + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


@pytest.mark.parametrize("image,mask,strength,field,words", BAD)
def test_a_bad_input_is_invalid_argument_and_a_400_naming_the_field(server, image, mask, strength, field, words):
    grpc_address, http_address = server
    with pytest.raises(grpc.RpcError) as err:
        grpc_client.generate(grpc_address, PROMPT, 1, steps=1, strength=strength, image=image, mask_image=mask,
                             timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"{field}:") and words in err.value.details(), err.value.details()
    strength_field = {} if strength is None else {"strength": str(strength)}
    parts = [("prompt", None, PROMPT.encode()), ("num_inference_steps", None, b"1"),
             *((k, None, v.encode()) for k, v in strength_field.items()),
             *([("image", "in.png", image)] if image is not None else []),
             *([("mask", "mask.png", mask)] if mask is not None else [])]
    status, body = call_json(http_address, "POST", "/v1/images/edits", multipart(parts),
                             headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})
    bad = body["error"]
    assert status == 400, body
    param = {"mask_image": "mask"}.get(field, field)
    assert bad["param"] == param and words in bad["message"], bad
    assert "Traceback" not in bad["message"]


def test_the_edits_route_refuses_a_json_body_and_generations_refuse_no_image(server):
    _, http_address = server
    status, body = call_json(http_address, "POST", "/v1/images/edits", {"prompt": PROMPT})
    assert status == 400 and body["error"]["param"] == "image"
    status, body = call_json(http_address, "POST", "/v1/images/generations", {"prompt": PROMPT})
    assert status == 400 and body["error"]["param"] == "image" and "needs an input image" in body["error"]["message"]


def test_playground_edits_an_uploaded_image_with_a_drawn_mask_as_the_grpc_reply(server, page, tmp_path):
    """The page shows what gRPC returns for the same image, the mask the page drew, and the fields typed."""
    grpc_address, http_address = server
    page.set_default_timeout(300_000)
    page.goto(f"http://{http_address}/")
    page.wait_for_function("document.getElementById('size').options.length > 0")
    assert page.is_visible("#image") and page.is_visible("#mask-tools") and page.input_value("#strength") == "0.6"
    page.set_input_files("#image", files=[{"name": "fox.png", "mimeType": "image/png", "buffer": INPUT}])
    page.wait_for_function("document.getElementById('mask').width === 40")
    box = page.locator("#mask").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.3)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.7, steps=8)
    page.mouse.up()
    drawn = base64.b64decode(page.evaluate("document.getElementById('mask').toDataURL('image/png')").split(",", 1)[1])
    mask = np.asarray(Image.open(io.BytesIO(drawn)).convert("L"))
    assert mask.shape == (48, 40) and 0 < (mask > 127).mean() < 0.6  # a stroke, not all or nothing
    page.fill("#prompt", PROMPT)
    page.fill("#steps", str(STEPS))
    page.fill("#seed", str(SEED))
    page.fill("#strength", "0.8")
    page.click("#generate")
    page.wait_for_function("document.querySelector('#result') && document.querySelector('#result').complete"
                           " && document.querySelector('#result').naturalWidth > 0")
    shown = base64.b64decode(page.get_attribute("#result", "src").split(",", 1)[1])
    assert shown == grpc_client.generate(grpc_address, PROMPT, SEED, steps=STEPS, strength=0.8, image=INPUT,
                                         mask_image=drawn, timeout=300).png
    page.screenshot(path=str(tmp_path / "playground-edit.png"), full_page=True)
