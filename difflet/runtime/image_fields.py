"""A request's image fields against its serving profile: which inputs the profile takes, and the
decoded, fitted `Pixels` the model process gets. Torch-free (the API process runs it).

Invariants:
- The profile says what it takes: `images = N` (an image-input profile: 1 to N images required),
  `mask = true` (inpainting: a mask of the image's size required), `strength = S` (the default
  strength; a profile without one takes none), `image_width`/`image_height` (the image compiled at
  its own size, which the reference pipeline must give it; `width`/`height` there: at the output
  size, so a request without a size takes its image's; else it is fitted to the output size),
  `image_original = true` (the unresized image too, for a pipeline that also reads it),
  `last_image = true` (first and last frame: exactly `images` = 2, the second the clip's last).
- Every image is decoded once, bounded before decoding (runtime/images.py); every rejection is a
  DiffletError whose `where` is the field (`image`, `image[i]`, `mask_image`, `strength`).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import msgspec

from difflet.errors import DiffletError
from difflet.ir.buckets import served_sizes
from difflet.runtime.images import ImageLimits, as_list, compiled_image_size, fit, follows_output, load
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
    if profile.get("last_image", False) and len(images) != most:
        raise _fail("image", f"{len(images)} of {most} images given: this model needs the first and the "
                             f"last frame (HTTP: input_reference and last_image; Python: image= and "
                             f"last_image=; gRPC and the CLI: two images, in that order)")
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
    loaded = [load(x, _field(i, len(images)), limits) for i, x in enumerate(images)]
    size = [(request.width, request.height)] * len(loaded)
    compiled = compiled_image_size(profile, request.width, request.height)
    if compiled is not None:  # the image is compiled at its own size
        for i, x in enumerate(loaded):
            _check_input_size(profile, x, compiled, input_sizes, _field(i, len(loaded)))
        size = [compiled] * len(loaded)
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


def size_from_image(profile: Mapping[str, Any], request: Request, image: Any, limits: ImageLimits | None,
                    sizes: Sequence[str], input_sizes: Sequence[tuple[int, int]]) -> tuple[Request, Any]:
    """(request, images): a request that gave no size, to a profile compiling its input image at the
    output size (`follows_output`), takes the size the reference pipeline gives its first image,
    which must be served; the images come back decoded (decoded once) for `resolve_media`.
    Any other request comes back as it was."""
    if request.width or request.height or not follows_output(profile) or image is None:
        return request, image
    images = as_list(image)
    limits = limits or ImageLimits.for_sizes(_areas(profile, sizes))
    loaded = [load(x, _field(i, len(images)), limits) for i, x in enumerate(images)]
    width, height = pipeline_size(profile, loaded[0], input_sizes, _field(0, len(loaded)))
    served = served_sizes(sizes) if sizes else (f"{profile['width']}x{profile['height']}",)
    if f"{width}x{height}" not in served:
        raise _fail(_field(0, len(loaded)), f"the reference pipeline sizes this {loaded[0].width}x{loaded[0].height} "
                                            f"image to {width}x{height} ({_how(profile)}), which this server does not "
                                            f"serve (served: {', '.join(served)})")
    return msgspec.structs.replace(request, width=width, height=height), loaded


def pipeline_size(profile: Mapping[str, Any], image, input_sizes: Sequence[tuple[int, int]],
                  field: str) -> tuple[int, int]:
    """The size an editing pipeline gives `image`: its own size floored to `image_multiple`,
    snapped to the family's preferred size nearest its aspect ratio under `image_auto_resize`
    (FluxKontextPipeline); a DiffletError naming `field` when it is below one multiple."""
    multiple = int(profile.get("image_multiple", 16))
    width, height = (x - x % multiple for x in image.size)
    if width < multiple or height < multiple:
        raise _fail(field, f"{image.width}x{image.height} is smaller than {multiple}x{multiple}")
    if profile.get("image_auto_resize", False) and input_sizes:
        _, width, height = min((abs(width / height - w / h), w, h) for w, h in input_sizes)
        width, height = width // multiple * multiple, height // multiple * multiple
    return width, height


def _check_input_size(profile: Mapping[str, Any], image, compiled: tuple[int, int],
                      input_sizes: Sequence[tuple[int, int]], field: str) -> None:
    """A DiffletError naming `field` unless the reference pipeline gives `image` the compiled size."""
    width, height = pipeline_size(profile, image, input_sizes, field)
    if (width, height) != compiled:
        where = "the output size" if follows_output(profile) else "its own size"
        raise _fail(field, f"the reference pipeline sizes this {image.width}x{image.height} image to {width}x{height} "
                           f"({_how(profile)}); this server compiles the input image at {where}, "
                           f"{compiled[0]}x{compiled[1]}")


def _how(profile: Mapping[str, Any]) -> str:
    return "the preferred size nearest its aspect ratio" if profile.get("image_auto_resize", False) else \
        f"its size floored to a multiple of {int(profile.get('image_multiple', 16))}"


def _field(i: int, count: int) -> str:
    return "image" if count == 1 else f"image[{i}]"


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
