"""A request's image fields against its serving profile: which inputs the profile takes, and the
decoded, fitted `Pixels` the model process gets. Torch-free (the API process runs it).

Invariants:
- The profile says what it takes: `images = N` (an image-input profile: 1 to N images required),
  `mask = true` (inpainting: a mask of the image's size required), `strength = S` (the default
  strength; a profile without one takes none), `image_width`/`image_height` (the image compiled at
  its own size, which the reference pipeline must give it; else it is fitted to the output size),
  `image_original = true` (the unresized image too, for a pipeline that also reads it).
- Every image is decoded once, bounded before decoding (runtime/images.py); every rejection is a
  DiffletError whose `where` is the field (`image`, `image[i]`, `mask_image`, `strength`).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import msgspec

from difflet.errors import DiffletError
from difflet.runtime.images import ImageLimits, as_list, fit, load
from difflet.runtime.request import DERIVED, Request


def _fail(field: str, message: str) -> DiffletError:
    return DiffletError(f"{field}: {message}", where=field)


def steps_run(num_steps: int, strength: float) -> int:
    """The denoising steps an image-to-image request runs: the pipelines' get_timesteps keeps the
    last min(num_steps x strength, num_steps) of them, truncated."""
    return num_steps - int(max(num_steps - min(num_steps * strength, num_steps), 0))


def profile_images(profile: Mapping[str, Any]) -> tuple[int, bool, float | None]:
    """(most input images, mask required, default strength) of a serving profile; (0, False, None)
    for a text-only one."""
    strength = profile.get("strength")
    return int(profile.get("images", 0) or 0), bool(profile.get("mask", False)), \
        None if strength is None else float(strength)


def resolve_media(profile: Mapping[str, Any], request: Request, image: Any, mask_image: Any,
           limits: ImageLimits | None, sizes: Sequence[str], input_sizes: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """The request's image fields and strength (of a `request` whose size is resolved), checked
    against the profile, decoded and fitted; raises DiffletError naming the field."""
    most, needs_mask, default_strength = profile_images(profile)
    images = as_list(image)
    if images and not most:
        raise _fail("image", "this model takes no input image (a text-to-image profile); serve an "
                             "image-input description of its family (README: Image inputs)")
    if most and not images:
        raise _fail("image", f"this model needs an input image ({_mode(profile)}); none was given")
    if len(images) > most:
        raise _fail("image", f"{len(images)} images given; this model takes at most {most}")
    if mask_image is not None and not needs_mask:
        raise _fail("mask_image", "this model takes no mask (only an inpainting profile does)")
    if needs_mask and mask_image is None:
        raise _fail("mask_image", "this inpainting model needs a mask (white = repaint, black = keep)")
    if request.strength is not None and default_strength is None:
        raise _fail("strength", f"this model takes no strength ({_mode(profile)})")
    if not images:
        return {}
    if limits is None:
        limits = ImageLimits.for_sizes(_areas(profile, sizes))
    loaded = [load(x, "image" if len(images) == 1 else f"image[{i}]", limits) for i, x in enumerate(images)]
    size = [(request.width, request.height)] * len(loaded)
    if "image_width" in profile:  # the image is compiled at its own size
        size = [_input_size(profile, x, input_sizes, "image" if len(images) == 1 else f"image[{i}]")
                for i, x in enumerate(loaded)]
    out: dict[str, Any] = {"image": tuple(fit(x, w, h, "RGB") for x, (w, h) in zip(loaded, size))}
    if profile.get("image_original", False):  # the pipeline also reads the image as given
        out["image_original"] = tuple(fit(x, x.width, x.height, "RGB") for x in loaded)
    if default_strength is not None:
        out["strength"] = default_strength if request.strength is None else request.strength
    if mask_image is not None:
        mask = load(mask_image, "mask_image", limits)
        if mask.size != loaded[0].size:
            raise _fail("mask_image", f"{mask.width}x{mask.height} does not match the image's "
                                      f"{loaded[0].width}x{loaded[0].height} (width x height)")
        out["mask_image"] = fit(mask, request.width, request.height, "L")
    return out


def _input_size(profile: Mapping[str, Any], image, input_sizes: Sequence[tuple[int, int]], field: str) -> tuple[int, int]:
    """The compiled input-image size, when the reference pipeline gives `image` that size (as
    an editing pipeline does: its own size floored to `image_multiple`, snapped to the family's
    preferred size nearest its aspect ratio under `image_auto_resize`); else a DiffletError
    naming `field`."""
    multiple = int(profile.get("image_multiple", 16))
    width, height = (x - x % multiple for x in image.size)
    if width < multiple or height < multiple:
        raise _fail(field, f"{image.width}x{image.height} is smaller than {multiple}x{multiple}")
    if profile.get("image_auto_resize", False) and input_sizes:
        _, width, height = min((abs(width / height - w / h), w, h) for w, h in input_sizes)
        width, height = width // multiple * multiple, height // multiple * multiple
    compiled = (int(profile["image_width"]), int(profile["image_height"]))
    if (width, height) != compiled:
        how = "the preferred size nearest its aspect ratio" if profile.get("image_auto_resize", False) else \
            f"its size floored to a multiple of {multiple}"
        raise _fail(field, f"the reference pipeline sizes this {image.width}x{image.height} image to {width}x{height} "
                           f"({how}); this server compiles the input image at {compiled[0]}x{compiled[1]}")
    return compiled


def _mode(profile: Mapping[str, Any]) -> str:
    most, needs_mask, strength = profile_images(profile)
    if not most:
        return "a text-to-image profile"
    return "an inpainting profile" if needs_mask else "an image-to-image profile" if strength is not None \
        else "an image-conditioned profile"


def _areas(profile: Mapping[str, Any], sizes: Sequence[str]) -> list[int]:
    served = [tuple(int(x) for x in s.split("x"))[:2] for s in sizes]
    return [w * h for w, h in served] + [int(profile["height"]) * int(profile["width"])]


def face_values(request: Request) -> dict[str, Any]:
    """The field values that admit `request` again (a saved job after a restart): its images as
    the face gave them (the unresized original where one was kept), no derived field."""
    values = msgspec.structs.asdict(request)
    original = {name: values.pop(name) for name in DERIVED}["image_original"]
    if original:
        values["image"] = original
    values["image"] = values["image"] or None
    return values
