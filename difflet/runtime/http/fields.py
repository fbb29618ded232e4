"""HTTP request bodies -> the keyword arguments of `Admission.check`, each field type-checked.

Invariants:
- Every refusal is a 400 `ApiError` whose `param` is the field as the client spelled it.
- The served shape is compiled in: `size` ("WxH") must be one of the served sizes (an artifact
  with shape buckets has several), `num_frames`, `seconds` and `fps` must match the profile (or
  be left out); everything else is checked by the gRPC path's Admission.
- Unknown fields are refused by name (a typo such as "steps" must not be silently ignored);
  OpenAI's presentation-only fields in IGNORED are accepted and have no effect.
- `seed` left out = a fresh random seed per image, reported back in each reply item.
"""
from __future__ import annotations

import math
import secrets
from typing import Any

from difflet.runtime.http.errors import ApiError, bad_field

MAX_N = 10
IMAGE_FORMATS = ("png", "jpeg", "webp")
IGNORED = ("user", "quality", "style", "background", "moderation")
COMMON = ("prompt", "model", "size", "seed", "num_inference_steps", "guidance_scale",
          "negative_prompt", "cache")
IMAGE_FIELDS = COMMON + ("n", "response_format", "output_format", "stream") + IGNORED
VIDEO_FIELDS = COMMON + ("seconds", "num_frames", "fps") + IGNORED


FORM_INTS = ("n", "seed", "num_inference_steps", "num_frames")
FORM_NUMBERS = ("guidance_scale", "fps", "timeout")


def form_fields(content_type: str, raw: bytes) -> dict[str, Any]:
    """A multipart/form-data body -> the JSON-shaped dict (numbers parsed by field name).
    A file part (OpenAI's `input_reference`) is refused: image-to-video is not served."""
    from email.parser import BytesParser
    from email.policy import HTTP

    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + raw)
    if not message.is_multipart():
        raise ApiError(400, "the multipart/form-data body could not be parsed", code="invalid_body")
    out: dict[str, Any] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name:
            continue
        if part.get_filename() is not None:
            raise bad_field(name, "file inputs are not served (text-to-image/video only)")
        text = part.get_payload(decode=True).decode("utf-8", "replace")
        try:
            out[name] = int(text) if name in FORM_INTS else float(text) if name in FORM_NUMBERS \
                else (text == "true") if name == "stream" and text in ("true", "false") else text
        except ValueError:
            raise bad_field(name, f"{text!r} is not a number") from None
    return out


def _type(body: dict, name: str, kinds, what: str):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        raise bad_field(name, f"must be {what}, not {type(value).__name__} {value!r}")
    return value


def _number(body: dict, name: str):
    value = _type(body, name, (int, float), "a number")
    if value is not None and not math.isfinite(value):
        raise bad_field(name, f"{value} must be finite")
    return value


def served_model(info) -> str:
    return info.module.name


def _common(body: Any, info, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", param=None, code="invalid_json")
    for name in body:
        if name not in allowed:
            raise bad_field(name, f"unknown field (accepted: {', '.join(allowed)})")
    prompt = _type(body, "prompt", (str,), "a string")
    if prompt is None:
        raise bad_field("prompt", "is required")
    model = _type(body, "model", (str,), "a string")
    if model is not None and model != served_model(info):
        raise ApiError(404, f"model: {model!r} is not served here (this server serves "
                            f"{served_model(info)!r})", "invalid_request_error", "model", "model_not_found")
    profile = info.profile
    height, width = int(profile["height"]), int(profile["width"])
    served = [s.split("x")[:2] for s in info.manifest.sizes]  # [width, height] text pairs, default first
    listed = ", ".join(f"{w}x{h}" for w, h in served)
    size = _type(body, "size", (str,), 'a string "WIDTHxHEIGHT"')
    if size is not None and size != "auto":
        w, sep, h = size.partition("x")
        if not (sep and w.isdigit() and h.isdigit()):
            raise bad_field("size", f"{size!r} is not WIDTHxHEIGHT (this server serves {listed})")
        if [w, h] not in served:
            raise bad_field("size", f"{size} is not served: sizes are compiled in, this server "
                                    f"serves {listed}")
        width, height = int(w), int(h)
    seed = _type(body, "seed", (int,), "an integer")
    steps = _type(body, "num_inference_steps", (int,), "an integer")
    guidance = _number(body, "guidance_scale")
    negative = _type(body, "negative_prompt", (str,), "a string")
    cache = _type(body, "cache", (str,), "a string")
    return {"prompt": prompt, "seed": secrets.randbelow(2**31) if seed is None else seed,
            "steps": steps, "guidance": None if guidance is None else float(guidance),
            "height": height, "width": width, "cache": cache or "", "negative_prompt": negative}


def image_request(body: Any, info) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Admission.check kwargs without request_id, reply options {n, response_format, output_format, stream})."""
    fields = _common(body, info, IMAGE_FIELDS)
    n = _type(body, "n", (int,), "an integer")
    if n is not None and not 1 <= n <= MAX_N:
        raise bad_field("n", f"{n} is outside [1, {MAX_N}]")
    response_format = _type(body, "response_format", (str,), "a string") or "b64_json"
    if response_format not in ("b64_json", "url"):
        raise bad_field("response_format", f"{response_format!r} is not b64_json or url")
    output_format = _type(body, "output_format", (str,), "a string") or "png"
    if output_format not in IMAGE_FORMATS:
        raise bad_field("output_format", f"{output_format!r} is not one of {', '.join(IMAGE_FORMATS)}")
    stream = _type(body, "stream", (bool,), "true or false") or False
    return fields, {"n": n or 1, "response_format": response_format, "output_format": output_format,
                    "stream": stream}


def video_request(body: Any, info, fps: float) -> dict[str, Any]:
    """Admission.check kwargs (without request_id) of a `POST /v1/videos` body."""
    fields = _common(body, info, VIDEO_FIELDS)
    size = f"{fields['width']}x{fields['height']}"
    served = [int(s.rsplit("x", 1)[1]) for s in info.manifest.sizes if s.rsplit("x", 1)[0] == size]
    frames = served[0] if size != f"{info.profile['width']}x{info.profile['height']}" else int(info.profile["frames"])
    num_frames = _type(body, "num_frames", (int,), "an integer")
    if num_frames is not None and num_frames not in served:
        raise bad_field("num_frames", f"{num_frames} is not served: the frame count is compiled in, "
                                      f"this server serves {', '.join(map(str, served))} at {size}")
    frames = num_frames if num_frames is not None else frames
    fields["frames"] = frames
    rate = _number(body, "fps")
    if rate is not None and rate != fps:
        raise bad_field("fps", f"{rate:g} is not served: this model writes {fps:g} fps")
    seconds = _type(body, "seconds", (str, int, float), "a number of seconds")
    if seconds is not None:
        try:
            value = float(seconds)
        except ValueError:
            raise bad_field("seconds", f"{seconds!r} is not a number") from None
        if abs(value - frames / fps) > 0.5 / fps:  # half a frame: the served length, in any spelling
            raise bad_field("seconds", f"{seconds} is not served: this server makes {frames} frames "
                                       f"at {fps:g} fps ({frames / fps:g} s)")
    return fields
