"""Request validation against the serving profile: field values -> a resolved `Request`.

Invariants:
- Types and ranges are the schema's (request.check); this module adds what depends on the
  profile: defaults, the served sizes, and the cache mode's syntax (the step-cache package's own
  parser decides, so the API process and the runner never disagree).
- Every rejection is a `DiffletError` whose `where` is the offending field name and whose
  message starts with that name (so gRPC details read "height: 64 does not match ...").
- Image size is compiled in: height/width must be the profile's (0 or None = the default) or,
  for an artifact with shape buckets, one of its served sizes ("WxH"; a video's frame count,
  0 = the profile's at the default size, else the first one served at that size).
- `lora` names a loaded adapter; resolved it always carries its scale (`NAME:SCALE`), so the model
  process never needs the server's load scales.
- Input images follow the profile: `images = N` (an image-input profile: 1 to N images
  required), `mask = true` (inpainting: a mask of the image's size required), `strength = S`
  (the default strength; a profile without one takes none), `image_width`/`image_height` (the
  image compiled at its own size, which the reference must give it; else at the output size),
  `image_original = true` (the unresized image too, for a pipeline that also reads it).
  They are decoded once and resized here (runtime/images.py), so the model process gets
  `Pixels` it uses as is.
- The result has every default resolved: it is what the model process runs, unchecked again.
"""
from __future__ import annotations

import math
import re
import uuid
from typing import Any, Mapping, Sequence

import msgspec

from difflet.errors import DiffletError
from difflet.runtime.images import ImageLimits, as_list, fit, load
from difflet.runtime.request import Request, check

SIZE_FIELDS = ("height", "width", "frames")
# The longest deadline a request may ask for: multiprocessing's wait() overflows past 2**31 ms
# (24.8 days), and no generation runs for a week.
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def _fail(field: str, message: str) -> DiffletError:
    return DiffletError(f"{field}: {message}", where=field)


def check_cache_mode(mode: str, field: str = "cache", calibrations: Mapping[str, str] | None = None) -> str:
    """The syntax and ranges of a cache mode string (the step-cache package's parser); returns it
    stripped. With `calibrations` (a server's `--calibration` names -> files) a calibrated mode
    must name one of them: a request never names a file on the server (None: the caller is the
    operator, as in the Python API, and names a file)."""
    from difflet.stepcache.modes import parse_mode

    mode = mode.strip()
    parsed = parse_mode(mode, field)
    if calibrations is not None and parsed.kind == "calibrated" and parsed.calibration not in calibrations:
        configured = ", ".join(sorted(calibrations)) or "none"
        raise _fail(field, f"calibration {parsed.calibration!r} is not configured on this server "
                           f"(configured: {configured}); the operator names calibration files with "
                           "--calibration NAME=FILE")
    return mode


def _size(field: str, value: int, profile: Mapping[str, Any]) -> int:
    expected = int(profile[field])
    if value and value != expected:
        raise _fail(field, f"{value} does not match the serving profile ({expected}); the image "
                           f"size is compiled in, so serve another profile for other sizes")
    return expected


def _bucket_size(h: int, w: int, f: int, profile: Mapping[str, Any], sizes: Sequence[str]) -> tuple[int, int, int]:
    """(height, width, frames) of a request to a bucketed artifact: 0 takes the default's."""
    h, w = h or int(profile["height"]), w or int(profile["width"])
    served = [tuple(int(x) for x in s.split("x")) for s in sizes]
    if (w, h) not in {s[:2] for s in served}:
        field = "width" if w not in {s[0] for s in served} else "height"
        raise _fail(field, f"{w}x{h} (width x height) is not a served size; served: {', '.join(sizes)}")
    if "frames" not in profile:
        return h, w, 0
    counts = [s[2] for s in served if s[:2] == (w, h)]
    default = int(profile["frames"]) if (w, h) == (int(profile["width"]), int(profile["height"])) else counts[0]
    if (f or default) not in counts:
        raise _fail("frames", f"{f or default} frames are not served at {w}x{h} (served: {', '.join(map(str, counts))})")
    return h, w, f or default


def _frames(frames: int, profile: Mapping[str, Any]) -> int:
    if "frames" not in profile:
        if frames:
            raise _fail("frames", f"{frames}: this model makes images, not videos")
        return 0
    expected = int(profile["frames"])
    if frames and frames != expected:
        raise _fail("frames", f"{frames} does not match the serving profile ({expected}); the frame "
                              "count is compiled in, so serve another profile (or shape buckets) for others")
    return expected


MAX_LORA_SCALE = 8.0
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # also the request field's pattern (request.lora)


def parse_calibration_spec(spec: str, field: str = "--calibration") -> tuple[str, str]:
    """`NAME=FILE` -> (name, file): the name a request's `calibrated:NAME` uses."""
    name, sep, path = spec.partition("=")
    if not sep or not path:
        raise _fail(field, f"{spec!r} is not NAME=FILE")
    if not ADAPTER_NAME.match(name):
        raise _fail(field, f"calibration name {name!r}: use 1-64 letters, digits, '_', '-' or '.'")
    return name, path


def parse_lora_spec(spec: str, field: str = "--lora") -> tuple[str, str, float]:
    """`NAME=PATH[:SCALE]` -> (name, path, scale; 1.0 when none), checked for syntax and range."""
    name, sep, rest = spec.partition("=")
    if not sep or not rest:
        raise _fail(field, f"{spec!r} is not NAME=PATH[:SCALE]")
    if not ADAPTER_NAME.match(name):
        raise _fail(field, f"adapter name {name!r}: use 1-64 letters, digits, '_', '-' or '.'")
    path, colon, scale = rest.rpartition(":")
    try:
        value = float(scale) if colon else 1.0
    except ValueError:
        path, value = rest, 1.0  # a ':' inside the path
    if not colon:
        path = rest
    if not (math.isfinite(value) and -MAX_LORA_SCALE <= value <= MAX_LORA_SCALE):
        raise _fail(field, f"{spec!r}: scale {value} is outside [-{MAX_LORA_SCALE:g}, {MAX_LORA_SCALE:g}]")
    return name, path, value


def check_lora(lora: str, adapters: Mapping[str, float], field: str = "lora") -> str:
    """`NAME[:SCALE]` of a loaded adapter as `NAME:SCALE` (its load scale when none is given); ""
    stays "" (the base weights). `adapters`: the loaded adapters' names -> load scales."""
    if not lora:
        return ""
    name, _, scale = lora.partition(":")
    if name not in adapters:
        loaded = ", ".join(sorted(adapters)) or "none; start the server with --lora NAME=PATH"
        raise _fail(field, f"adapter {name!r} is not loaded (loaded: {loaded})")
    value = float(scale) if scale else float(adapters[name])
    if not -MAX_LORA_SCALE <= value <= MAX_LORA_SCALE:
        raise _fail(field, f"scale {value} is outside [-{MAX_LORA_SCALE:g}, {MAX_LORA_SCALE:g}]")
    return f"{name}:{value!r}"


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


def _media(profile: Mapping[str, Any], request: Request, image: Any, mask_image: Any,
           limits: ImageLimits | None, sizes: Sequence[str], input_sizes: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """The request's image fields and strength, checked against the profile, decoded and fitted."""
    most, needs_mask, default_strength = profile_images(profile)
    images = as_list(image)
    if images and not most:
        raise _fail("image", "this model takes no input image (a text-to-image profile); serve an "
                             "image-input description of its family, e.g. models/flux-img2img.dsl")
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
    if "image_width" in profile:  # the image is compiled at its own size (FLUX.1 Kontext)
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
    FluxKontextPipeline: its own size floored to `image_multiple`, snapped to the preferred size
    nearest its aspect ratio under `image_auto_resize`); else a DiffletError naming `field`."""
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


def resolve_request(profile: Mapping[str, Any], sizes: Sequence[str] = (), adapters: Mapping[str, float] | None = None,
                    calibrations: Mapping[str, str] | None = None, image: Any = None, mask_image: Any = None,
                    image_limits: ImageLimits | None = None, input_sizes: Sequence[tuple[int, int]] = (),
                    **values: Any) -> Request:
    """Check one request (field values; None = not given) against `profile`, the served `sizes`
    of a bucketed artifact, the loaded LoRA `adapters` (name -> load scale) and the configured
    `calibrations` (check_cache_mode), and fill defaults; raises DiffletError naming the field.
    `image` (one or a list) and `mask_image`: encoded image bytes or PIL images, bounded by
    `image_limits` (default: sized for the served sizes); `input_sizes`: the family's preferred
    input sizes (FamilyFacts.input_sizes) of a profile compiling the image at its own size."""
    request = check(values)
    if len(sizes) > 1:
        height, width, frames = _bucket_size(request.height, request.width, request.frames, profile, sizes)
    else:
        height, width = _size("height", request.height, profile), _size("width", request.width, profile)
        frames = _frames(request.frames, profile)
    request = msgspec.structs.replace(request, height=height, width=width)
    media = _media(profile, request, image, mask_image, image_limits, sizes, input_sizes)
    steps = int(profile["steps"]) if request.steps is None else request.steps
    if "strength" in media and steps_run(steps, media["strength"]) < 1:
        raise _fail("strength", f"{media['strength']:g} of {steps} steps leaves no step to run (as in the "
                                f"reference pipeline); give at least 1/{steps}")
    return msgspec.structs.replace(
        request, frames=frames, **media,
        steps=int(profile["steps"]) if request.steps is None else request.steps,
        guidance=float(profile["guidance"]) if request.guidance is None else request.guidance,
        request_id=request.request_id or uuid.uuid4().hex[:16],
        cache=check_cache_mode(request.cache, calibrations=calibrations) if request.cache.strip() else "",
        lora=check_lora(request.lora, adapters or {}))
