"""Input images at admission (runtime/images.py, validate.resolve_request): torch-free and fast.

Oracles: PIL's own reading of the same file as diffusers' `load_image` and VaeImageProcessor's
resize do it (the reference pipelines' path), the profile's declared image inputs, and for the
fuzzer the contract that any bytes either decode or raise a DiffletError naming the field.
"""
from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from difflet.errors import DiffletError
from difflet.runtime.images import ImageLimits, fit, load, to_pil, warm_up_inputs
from difflet.runtime.validate import resolve_request

TEXT_ONLY = {"height": 32, "width": 32, "steps": 4, "guidance": 3.5}
IMG2IMG = {**TEXT_ONLY, "images": 1, "strength": 0.6}
INPAINT = {**IMG2IMG, "mask": True}
FLF2V = {**TEXT_ONLY, "images": 2, "last_image": True}  # wan2.1-flf2v's: the first and the last frame
LIMITS = ImageLimits(max_bytes=1 << 20, max_pixels=512 * 512)


def encoded(image: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


RGBA = Image.fromarray(np.random.default_rng(1).integers(0, 256, (30, 50, 4), dtype=np.uint8), "RGBA")


def refused(profile, **values) -> DiffletError:
    with pytest.raises(DiffletError) as err:
        resolve_request(profile, image_limits=LIMITS, prompt="p", **values)
    return err.value


def test_fit_is_the_reference_pipelines_resize_of_load_image():
    data = encoded(RGBA)
    got = fit(load(data, "image", LIMITS), 32, 32, "RGB")
    # diffusers.utils.load_image (exif_transpose + RGB), then VaeImageProcessor.resize (lanczos)
    ref = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB").resize(
        (32, 32), resample=Image.Resampling.LANCZOS, reducing_gap=None)
    assert got.data == ref.tobytes() and (got.width, got.height, got.mode) == (32, 32, "RGB")
    assert to_pil(got).tobytes() == ref.tobytes()
    mask = fit(load(data, "mask_image", LIMITS), 32, 32, "L")  # the mask processor: resize, then grayscale
    assert mask.data == ref.convert("L").tobytes() or mask.data == \
        Image.open(io.BytesIO(data)).convert("RGB").resize((32, 32), Image.Resampling.LANCZOS).convert("L").tobytes()


def test_exif_orientation_is_applied_as_load_image_does():
    image = Image.fromarray(np.arange(20 * 10 * 3, dtype=np.uint8).reshape(20, 10, 3))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW to display
    got = load(encoded(image, "JPEG", exif=exif), "image", LIMITS)
    assert got.size == (20, 10)


def test_a_text_only_profile_refuses_every_image_field():
    png = encoded(RGBA)
    assert refused(TEXT_ONLY, image=png).where == "image"
    assert "takes no input image" in refused(TEXT_ONLY, image=png).message
    assert refused(TEXT_ONLY, strength=0.5).where == "strength"
    assert refused(TEXT_ONLY, mask_image=png).where == "mask_image"
    assert resolve_request(TEXT_ONLY, prompt="p").image == ()


def test_an_image_profile_takes_its_image_count_and_resolves_strength():
    png = encoded(RGBA)
    assert "needs an input image" in refused(IMG2IMG).message
    assert "at most 1" in refused(IMG2IMG, image=[png, png]).message
    assert refused(IMG2IMG, image=png, mask_image=png).where == "mask_image"
    request = resolve_request(IMG2IMG, image_limits=LIMITS, prompt="p", image=png)
    assert request.strength == 0.6 and len(request.image) == 1 and request.image[0].width == 32
    assert resolve_request(IMG2IMG, image_limits=LIMITS, prompt="p", image=png, strength=1).strength == 1.0
    err = refused(IMG2IMG, image=png, strength=1e-300)
    assert err.where == "strength" and "leaves no step" in err.message


def test_a_first_last_frame_profile_needs_both_images():
    png = encoded(RGBA)
    err = refused(FLF2V, image=png)
    assert err.where == "image" and "1 of 2 images" in err.message and "last frame" in err.message
    assert "at most 2" in refused(FLF2V, image=[png, png, png]).message
    request = resolve_request(FLF2V, image_limits=LIMITS, prompt="p", image=[png, png])
    assert len(request.image) == 2 and request.strength is None


def test_the_image_is_fitted_to_the_requests_shape_bucket():
    """A bucketed artifact (validate._bucket_size): the image and mask follow the size the request
    resolves to, as the reference pipeline resizes them to its height and width."""
    sizes = ["32x32", "48x32"]
    png, mask = encoded(RGBA), encoded(Image.new("L", (50, 30), 255))
    request = resolve_request(INPAINT, sizes, image_limits=LIMITS, prompt="p", width=48, height=32,
                              image=png, mask_image=mask)
    assert (request.image[0].width, request.image[0].height) == (48, 32)
    assert (request.mask_image.width, request.mask_image.height) == (48, 32)
    assert request.image[0].data == fit(load(png, "image", LIMITS), 48, 32, "RGB").data
    with pytest.raises(DiffletError) as err:  # a size no bucket serves: refused before any decoding
        resolve_request(INPAINT, sizes, image_limits=LIMITS, prompt="p", width=40, image=b"not an image")
    assert err.value.where == "width" and "not a served size" in err.value.message


def test_an_inpainting_profile_needs_a_mask_of_the_images_size():
    png = encoded(RGBA)
    assert "needs a mask" in refused(INPAINT, image=png).message
    err = refused(INPAINT, image=png, mask_image=encoded(Image.new("L", (50, 31))))
    assert err.where == "mask_image" and "50x31 does not match the image's 50x30" in err.message
    request = resolve_request(INPAINT, image_limits=LIMITS, prompt="p", image=png,
                              mask_image=encoded(Image.new("L", (50, 30), 255)))
    assert request.mask_image.mode == "L" and request.mask_image.data == b"\xff" * 32 * 32


@pytest.mark.parametrize("profile, masked", [(TEXT_ONLY, False), (INPAINT, True),
                                             ({**TEXT_ONLY, "images": 1, "image_original": True}, False)])
def test_a_saved_request_is_admitted_again_as_it_was(profile, masked):
    """A queued job a restarted server submits again (http/recovery.py): the saved Request,
    decoded from its JSON, resolves to itself (its images are not resized twice)."""
    import msgspec

    from difflet.runtime.image_fields import face_values
    from difflet.runtime.request import Request

    media = {"image": encoded(RGBA)} if profile.get("images") else {}
    if masked:
        media["mask_image"] = encoded(Image.fromarray(np.random.default_rng(2).integers(0, 256, (30, 50), dtype=np.uint8)))
    first = resolve_request(profile, image_limits=LIMITS, prompt="p", **media)
    saved = msgspec.json.decode(msgspec.json.encode(first), type=Request)
    again = resolve_request(profile, image_limits=LIMITS, **face_values(saved))
    assert again == first
    if profile.get("image_original"):
        assert (first.image_original[0].width, first.image[0].width) == (50, 32)


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height, with one tiny IDAT: a decompression bomb's shape."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


def test_bounds_are_checked_before_decoding():
    with pytest.raises(DiffletError, match=r"image: (100000x100000 )?is over the bound of 262144 pixels"):
        load(_png_header_only(100000, 100000), "image", LIMITS)  # PIL's own bomb bound, 2 x 89 MP
    with pytest.raises(DiffletError, match=r"image: 3000x3000 is over the bound of 262144 pixels"):
        load(_png_header_only(3000, 3000), "image", LIMITS)  # ours, read from the header
    with pytest.raises(DiffletError, match=r"image\[1\]: 1048577 bytes is over the bound"):
        load(b"\0" * ((1 << 20) + 1), "image[1]", LIMITS)
    assert ImageLimits.for_sizes([1024 * 1024]).max_pixels == 16 * 1024 * 1024
    assert ImageLimits.for_sizes([32 * 32]).max_pixels == 2048 * 2048  # never below a 4 MP photo


def test_warm_up_inputs_pass_admission_for_each_profile():
    for profile in (TEXT_ONLY, IMG2IMG, INPAINT, FLF2V):
        resolve_request(profile, image_limits=LIMITS, prompt="p", **warm_up_inputs(profile, 32, 32))


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=600) | st.builds(lambda cut, junk: encoded(RGBA)[:cut] + junk,
                                                 st.integers(0, 400), st.binary(max_size=40)))
def test_any_bytes_decode_or_are_refused_naming_the_field(data):
    try:
        image = load(data, "image", LIMITS)
    except DiffletError as err:
        assert err.where == "image" and err.message.startswith("image: ")
    else:
        assert image.mode == "RGB" and image.width * image.height <= LIMITS.max_pixels


def test_an_editing_profile_compiled_at_the_output_size_takes_its_size_from_the_image():
    """`image_width = width` (flux-kontext): a request without a size gets the one the reference
    pipeline gives its image (FluxKontextPipeline: floored to the multiple; with _auto_resize the
    preferred size nearest its aspect ratio), which must be a served bucket; a given size must be
    the image's. Oracle: the pipeline's sizing arithmetic written out per case."""
    from difflet.families.flux.facts import FACTS

    kontext = {**TEXT_ONLY, "images": 1, "image_width": "width", "image_height": "height", "image_multiple": 16,
               "image_auto_resize": True}
    sizes, preferred = ("1024x1024", "1392x752", "752x1392"), FACTS.input_sizes
    # 1600x900 floors to 1600x896 (1.786): nearest preferred 1392x752 (1.851; 1328x800 is 1.66)
    wide = encoded(Image.new("RGB", (1600, 900)))
    kontext = {**kontext, "height": 1024, "width": 1024}
    got = resolve_request(kontext, sizes, image=wide, image_limits=ImageLimits(1 << 22, 1 << 22),
                          input_sizes=preferred, prompt="p")
    assert (got.width, got.height) == (1392, 752) and (got.image[0].width, got.image[0].height) == (1392, 752)
    with pytest.raises(DiffletError) as err:  # a 4:3 image snaps to 1184x880, not served here
        resolve_request(kontext, sizes, image=encoded(Image.new("RGB", (800, 600))), input_sizes=preferred,
                        prompt="p")
    assert err.value.where == "image" and "sizes this 800x600 image to 1184x880" in err.value.message
    with pytest.raises(DiffletError) as err:  # a size asked for that is not the image's
        resolve_request(kontext, sizes, image=wide, image_limits=ImageLimits(1 << 22, 1 << 22),
                        input_sizes=preferred, prompt="p", width=1024, height=1024)
    assert err.value.where == "image" and "at the output size, 1024x1024" in err.value.message
    tiny = {**TEXT_ONLY, "images": 1, "image_width": "width", "image_height": "height", "image_multiple": 4}
    got = resolve_request(tiny, ("32x32", "48x32"), image=encoded(Image.new("RGB", (50, 33))), prompt="p")
    assert (got.width, got.height) == (48, 32)  # no auto-resize: floored to the multiple of 4
