"""Input images of a request: encoded bytes (or a PIL image) -> `Pixels` at the request's size,
in the API process, without torch.

What the reference pipelines get is what diffusers' `load_image` makes of a file (EXIF
orientation applied, converted to RGB), and their VaeImageProcessor.preprocess then resizes it
with PIL (lanczos, reducing_gap None) to the call's height x width and converts it (RGB for an
image; grayscale "L" after resizing for a mask processor). `fit` does exactly those PIL calls, so
the model process's preprocess (a same-size resize: PIL returns a copy) sees the same pixels.

Invariants:
- Bounds are checked before any pixel is decoded: the encoded size (`max_bytes`) first, then the
  header's width x height (`max_pixels`), so a decompression bomb never reaches PIL's decoder.
- Every rejection is a DiffletError naming the field (`image`, `image[1]`, `mask_image`).
- Nothing is written to disk: decoding reads from memory.
"""
from __future__ import annotations

import io
import struct
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

from difflet.errors import DiffletError
from difflet.runtime.request import Pixels

FORMATS = ("PNG", "JPEG", "WEBP")  # what the OpenAI edits route documents, and what PIL reads safely
MIN_PIXELS_BOUND = 2048 * 2048  # the default pixel bound is never below a 4-megapixel photo


@dataclass(frozen=True)
class ImageLimits:
    """The configured bounds of one input image (the server's --max-image-bytes/-pixels)."""

    max_bytes: int
    max_pixels: int

    @classmethod
    def for_sizes(cls, areas: Sequence[int], max_bytes: int = 0, max_pixels: int = 0) -> "ImageLimits":
        """The given bounds, each 0 taking its default sized for the served sizes: pixels 16x the
        largest area (4x per side), at least 4 MP; bytes 4 per allowed pixel (more than an RGBA
        PNG of it needs) + 1 MiB."""
        pixels = max_pixels or max(16 * max(areas, default=0), MIN_PIXELS_BOUND)
        return cls(max_bytes=max_bytes or 4 * pixels + (1 << 20), max_pixels=pixels)


def _fail(field: str, message: str) -> DiffletError:
    return DiffletError(f"{field}: {message}", where=field)


def load(value: Any, field: str, limits: ImageLimits):
    """One input image as diffusers' load_image makes it (RGB, EXIF orientation applied): from
    encoded bytes (PNG/JPEG/WebP), a PIL image (the Python API) or Pixels (a saved request)."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if isinstance(value, Pixels):  # already decoded once: only its size is bounded again
        value = to_pil(value)
    if isinstance(value, Image.Image):
        image = value
        if image.width * image.height > limits.max_pixels:
            raise _fail(field, f"{image.width}x{image.height} is over the bound of {limits.max_pixels} pixels")
    else:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise _fail(field, f"must be an image file's bytes, not {type(value).__name__}")
        data = bytes(value)
        if len(data) > limits.max_bytes:
            raise _fail(field, f"{len(data)} bytes is over the bound of {limits.max_bytes} bytes")
        try:
            with warnings.catch_warnings():  # our own bound below is the one that refuses
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                image = Image.open(io.BytesIO(data), formats=FORMATS)
        except UnidentifiedImageError:
            raise _fail(field, _what(data)) from None
        except Image.DecompressionBombError:  # a header claiming over 2 x PIL's own bound
            raise _fail(field, f"is over the bound of {limits.max_pixels} pixels") from None
        except (OSError, SyntaxError, ValueError, struct.error, EOFError):  # a damaged header
            raise _fail(field, "the image data is damaged (its header cannot be read)") from None
        if image.width * image.height > limits.max_pixels:  # read from the header; nothing decoded yet
            raise _fail(field, f"{image.width}x{image.height} is over the bound of {limits.max_pixels} pixels")
        try:
            image.load()
        except (OSError, SyntaxError, ValueError, struct.error, EOFError) as err:  # truncated or corrupt data
            raise _fail(field, f"the {image.format} data is damaged ({type(err).__name__})") from None
    if image.width < 1 or image.height < 1:
        raise _fail(field, "is empty (0 pixels)")
    return ImageOps.exif_transpose(image).convert("RGB")  # diffusers.utils.load_image


def _what(data: bytes) -> str:
    """Why PIL read no supported image from `data`: another format, or no image at all."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fmt = Image.open(io.BytesIO(data)).format
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, struct.error, EOFError,
            Image.DecompressionBombError):
        return "is not an image (PNG, JPEG or WebP)"
    return f"{fmt} is not a supported format (PNG, JPEG or WebP)"


def fit(image, width: int, height: int, mode: str) -> Pixels:
    """`image` resized as VaeImageProcessor.preprocess does (lanczos, reducing_gap None), then
    converted to `mode` ("RGB" or "L", the mask processor's grayscale)."""
    from PIL import Image

    if image.size != (width, height):
        image = image.resize((width, height), resample=Image.Resampling.LANCZOS, reducing_gap=None)
    image = image.convert(mode)
    return Pixels(width=width, height=height, mode=mode, data=image.tobytes())


def to_pil(pixels: Pixels):
    """The PIL image of `pixels` (the model process hands it to the pipeline's own preprocess)."""
    from PIL import Image

    return Image.frombytes(pixels.mode, (pixels.width, pixels.height), pixels.data)


def follows_output(profile) -> bool:
    """Whether the profile compiles its input image at the output size (`image_width = width`,
    `image_height = height`): each shape bucket is then also one input-image size."""
    return profile.get("image_width") == "width" and profile.get("image_height") == "height"


def compiled_image_size(profile, width: int, height: int) -> tuple[int, int] | None:
    """(width, height) the profile compiles its input image at, for output `width` x `height`;
    None when it fits the image to the output (no `image_width`)."""
    from difflet.frontend.shapes import resolved

    if "image_width" not in profile:
        return None
    sized = {**dict(profile.items()), "width": width, "height": height}  # an alias reads this size
    return int(resolved(sized, "image_width")), int(resolved(sized, "image_height"))


def warm_up_inputs(profile, width: int, height: int) -> dict[str, Any]:
    """A warm-up request's image fields for an image-input profile (none for a text-only one):
    a gradient image (and its mirror as the last frame of a `last_image` profile), and a mask
    repainting its left half."""
    from PIL import Image

    if not int(profile.get("images", 0) or 0):
        return {}
    width, height = compiled_image_size(profile, width, height) or (width, height)
    ramp = Image.linear_gradient("L").resize((width, height))
    image = Image.merge("RGB", (ramp, ramp.transpose(Image.Transpose.ROTATE_90).resize((width, height)),
                                Image.new("L", (width, height), 96)))
    out: dict[str, Any] = {"image": image}
    if profile.get("last_image", False):
        out["image"] = [image, image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    if profile.get("mask", False):
        mask = Image.new("L", (width, height), 0)
        mask.paste(255, (0, 0, max(1, width // 2), height))
        out["mask_image"] = mask.convert("RGB")
    return out


def as_list(value: Any) -> list:
    """One image or a sequence of them as a list (None: none)."""
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
