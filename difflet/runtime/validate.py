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
- Input images follow the profile (runtime/image_fields.py): decoded once and resized here, so
  the model process gets `Pixels` it uses as is.
- The result has every default resolved: it is what the model process runs, unchecked again.
"""
from __future__ import annotations

import math
import re
import uuid
from typing import Any, Mapping, Sequence

import msgspec

from difflet.errors import DiffletError
from difflet.runtime.image_fields import resolve_media, size_from_image, steps_run
from difflet.runtime.images import ImageLimits
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


def _guidance_2(request: Request, profile: Mapping[str, Any]) -> float | None:
    """A two-expert profile's (`guidance_2`) low-noise scale: the request's; else its `guidance`
    (WanPipeline's guidance_scale_2=None); else the profile's. None for a one-denoiser profile."""
    if "guidance_2" not in profile:
        if request.guidance_2 is not None:
            raise _fail("guidance_2", "this model has one denoiser; guidance_2 is a two-expert model's "
                                      "(Wan 2.2 A14B) low-noise guidance scale")
        return None
    for value in (request.guidance_2, request.guidance, profile["guidance_2"]):
        if value is not None:
            return float(value)


def _profile_scale(name: str, value: float | None, profile: Mapping[str, Any]) -> float | None:
    """A scale only some profiles have (`stg_scale`, `modality_scale`): the request's, else the
    profile's; refused naming the field where the profile has none."""
    if name not in profile:
        if value is not None:
            raise _fail(name, f"this model has no {name} (its profile states none)")
        return None
    return float(profile[name]) if value is None else float(value)


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
    request, image = size_from_image(profile, request, image, image_limits, sizes, input_sizes)
    if len(sizes) > 1:
        height, width, frames = _bucket_size(request.height, request.width, request.frames, profile, sizes)
    else:
        height, width = _size("height", request.height, profile), _size("width", request.width, profile)
        frames = _frames(request.frames, profile)
    request = msgspec.structs.replace(request, height=height, width=width)
    media = resolve_media(profile, request, image, mask_image, image_limits, sizes, input_sizes)
    steps = int(profile["steps"]) if request.steps is None else request.steps
    if "strength" in media and steps_run(steps, media["strength"]) < 1:
        raise _fail("strength", f"{media['strength']:g} of {steps} steps leaves no step to run (as in the "
                                f"reference pipeline); give at least 1/{steps}")
    return msgspec.structs.replace(
        request, frames=frames, **media,
        steps=int(profile["steps"]) if request.steps is None else request.steps,
        guidance=float(profile["guidance"]) if request.guidance is None else request.guidance,
        guidance_2=_guidance_2(request, profile),
        stg_scale=_profile_scale("stg_scale", request.stg_scale, profile),
        modality_scale=_profile_scale("modality_scale", request.modality_scale, profile),
        request_id=request.request_id or uuid.uuid4().hex[:16],
        cache=check_cache_mode(request.cache, calibrations=calibrations) if request.cache.strip() else "",
        lora=check_lora(request.lora, adapters or {}))
