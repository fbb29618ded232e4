"""HTTP request bodies -> the field values `Admission.admit` takes, in the HTTP API's names.

Invariants:
- The request fields and their HTTP names are request.Request's ("http" spelling): each body
  field is handed to admission unchanged, which checks type, range and served size once (for
  gRPC too); `refusal` turns its error into a 400 naming the field as the client spelled it.
- Only what is HTTP's own is checked here: the body's shape, unknown fields (a typo such as
  "steps" must not be silently ignored; OpenAI's presentation-only fields in IGNORED are accepted
  and have no effect), `model`, the `size` text ("WxH"), `seed`'s type (absent = a fresh random
  seed per image, reported back in each reply item; image i of n takes seed + i), the reply
  options, a video's `fps` (the model's) and `seconds` (a frame count at that rate), and a
  video's `input_reference` (one file part, or a base64 data URL: never fetched) as `image`, with
  Difflet's `last_image` (the same forms) as its second image, a first-last-frame model's last.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
import secrets
from typing import Any

from difflet.errors import DiffletError
from difflet.runtime.http.errors import ApiError, bad_field, from_admission
from difflet.runtime.request import FIELDS, names
from difflet.runtime.validate import MAX_TIMEOUT_S

MAX_N = 10
IMAGE_FORMATS = ("png", "jpeg", "webp")
IGNORED = ("user", "quality", "style", "background", "moderation")
HTTP_NAME = names("http")  # request field -> its body field ("size" carries height and width)
VIDEO_ONLY = ("frames",)
COMMON = ("model", *dict.fromkeys(n for f, n in HTTP_NAME.items() if f not in VIDEO_ONLY))
IMAGE_FIELDS = COMMON + ("n", "response_format", "output_format", "stream") + IGNORED
# POST /v1/images/edits: the generation fields and the files the openai package sends
# (`image`, or `image[]` for several; `mask`); the mask's request field is `mask_image`
EDIT_FILES = ("image", "image[]", "mask")
EDIT_FIELDS = IMAGE_FIELDS + EDIT_FILES + ("input_fidelity",)
EDIT_SPELLED = {"mask_image": "mask"}
# POST /v1/videos: OpenAI's `input_reference` (the openai package sends a file part) is the
# request's `image`, the first frame of an image-to-video model; `last_image` (Difflet's) its last
VIDEO_FILES = ("input_reference", "last_image")
VIDEO_FIELDS = COMMON + tuple(HTTP_NAME[f] for f in VIDEO_ONLY) + ("seconds", "fps") + VIDEO_FILES + IGNORED
DATA_URL = "data:"

FORM_INTS = ("n", *(HTTP_NAME[f.name] for f in FIELDS if f.kind is int and HTTP_NAME.get(f.name, "size") != "size"))
FORM_NUMBERS = ("fps", "timeout", *(HTTP_NAME[f.name] for f in FIELDS if f.kind is float and f.name in HTTP_NAME))


def decode_body(content_type: str, raw: bytes, files: tuple[str, ...] = ()) -> Any:
    """A request body -> its JSON value (a multipart form as the dict of its fields; the file
    parts named in `files` as lists of their bytes)."""
    if content_type.startswith("multipart/form-data"):  # what the openai package sends to POST /videos
        return form_fields(content_type, raw, files)
    try:
        return json.loads(raw or b"null")
    except ValueError as err:
        raise ApiError(400, f"the body is not JSON: {err}", code="invalid_json") from None
    except RecursionError:  # 2 KB of '[' is enough: a client's mistake, not a server error
        raise ApiError(400, "the body is JSON nested too deeply", code="invalid_json") from None


def timeout(body) -> float | None:
    """The body's `timeout` (taken out of it): seconds, within the deadline bound."""
    value = body.pop("timeout", None) if isinstance(body, dict) else None
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0 < value <= MAX_TIMEOUT_S):
        raise bad_field("timeout", f"{value!r} must be a number of seconds > 0 and <= {MAX_TIMEOUT_S:g} (7 days)")
    return value


class _Parts:
    """python-multipart's callbacks collected: per part, header name (lowercase) -> value, and
    b"" -> the part's data (a nested multipart part stays bytes: refused by form_fields)."""

    def __init__(self) -> None:
        self.parts: list[dict[bytes, bytes]] = []
        self._field = self._value = b""

    def callbacks(self) -> dict:
        def add(attr):  # a callback appending data[start:end] to `attr`
            return lambda data, start, end: setattr(self, attr, getattr(self, attr) + data[start:end])
        return {"on_part_begin": lambda: self.parts.append({b"": b""}),
                "on_part_data": lambda data, start, end: self.parts[-1].update(
                    {b"": self.parts[-1][b""] + data[start:end]}),
                "on_header_field": add("_field"), "on_header_value": add("_value"),
                "on_header_end": self._header_end}

    def _header_end(self) -> None:
        self.parts[-1][self._field.lower()] = self._value
        self._field = self._value = b""


def form_fields(content_type: str, raw: bytes, files: tuple[str, ...] = ()) -> dict[str, Any]:
    """A multipart/form-data body (python-multipart) -> the JSON-shaped dict (numbers parsed by
    field name); a part named in `files` (a file or not) -> the list of its parts' bytes; any
    other file part is refused."""
    from python_multipart.exceptions import FormParserError
    from python_multipart.multipart import MultipartParser, parse_options_header

    boundary = parse_options_header(content_type)[1].get(b"boundary")
    if not boundary:
        raise ApiError(400, "the multipart/form-data body has no boundary", code="invalid_body")
    parts = _Parts()
    try:
        parser = MultipartParser(boundary, parts.callbacks(), max_size=len(raw))
        parser.write(raw)
        parser.finalize()
    except FormParserError as err:  # the client's malformed body
        raise ApiError(400, f"the multipart/form-data body could not be parsed ({type(err).__name__})",
                       code="invalid_body") from None
    out: dict[str, Any] = {}
    for part in parts.parts:
        _, params = parse_options_header(part.get(b"content-disposition", b""))
        name = params.get(b"name", b"").decode("utf-8", "replace")
        if not name:
            continue
        if name in files:
            out.setdefault(name, []).append(part[b""])
            continue
        if b"filename" in params:
            raise bad_field(name, "file inputs are not served here (images: POST /v1/images/edits)")
        if part.get(b"content-type", b"").lower().startswith(b"multipart/"):  # parts, not a value
            raise bad_field(name, "a nested multipart part is not a field value")
        text = part[b""].decode("utf-8", "replace")
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
        if name not in allowed:  # named as sent when it is a plain short name, else quoted and cut
            shown = name if name.isidentifier() and len(name) <= 64 else repr(name[:64])
            raise bad_field(shown, f"unknown field (accepted: {', '.join(allowed)})")
    model = _type(body, "model", (str,), "a string")
    if model is not None and model != served_model(info):
        raise ApiError(404, f"model: {model!r} is not served here (this server serves "
                            f"{served_model(info)!r})", "invalid_request_error", "model", "model_not_found")
    values = {f: body.get(n) for f, n in HTTP_NAME.items() if n in allowed and n != "size"}
    size = _type(body, "size", (str,), 'a string "WIDTHxHEIGHT"')
    if size is not None and size != "auto":
        w, sep, h = size.partition("x")
        if not (sep and w.isdigit() and h.isdigit()):
            listed = ", ".join("x".join(s.split("x")[:2]) for s in info.manifest.sizes)
            raise bad_field("size", f"{size!r} is not WIDTHxHEIGHT (this server serves {listed})")
        values["width"], values["height"] = int(w), int(h)
    seed = _type(body, "seed", (int,), "an integer")
    values["seed"] = secrets.randbelow(2**31) if seed is None else seed
    return values


def refusal(err: DiffletError, values: dict[str, Any], info, spelled: dict[str, str]) -> ApiError:
    """Admission's refusal of `values` as a 400 in the HTTP API's words: a size as `size` (the
    served list), a field the body spelled otherwise (`spelled`: field -> body field) by that name."""
    if err.where in ("height", "width"):
        p = info.profile
        size = f"{values.get('width') or p['width']}x{values.get('height') or p['height']}"
        listed = ", ".join("x".join(s.split("x")[:2]) for s in info.manifest.sizes)
        return bad_field("size", f"{size} is not served: sizes are compiled in, this server serves {listed}")
    if err.where in spelled:  # "seconds: frames: 64 does not match ..."
        return bad_field(spelled[err.where], err.message)
    return from_admission(err)


def image_request(body: Any, info) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Admission.admit values without request_id, reply options {n, response_format, output_format, stream})."""
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


def edit_request(body: Any, info) -> tuple[dict[str, Any], dict[str, Any]]:
    """`image_request` of a POST /v1/images/edits form: its `image` / `image[]` files (in order)
    and `mask` become the request's `image` and `mask_image` (decoded by admission)."""
    if not isinstance(body, dict) or not any(isinstance(body.get(n), list) for n in EDIT_FILES):
        if isinstance(body, dict) and any(n in body for n in EDIT_FILES):
            raise bad_field("image", "send the images as multipart/form-data file parts, as the openai package does")
        raise ApiError(400, "image: POST /v1/images/edits takes a multipart/form-data body with an "
                            "`image` (or `image[]`) file", param="image", code="invalid_body")
    images = body.pop("image", []) + body.pop("image[]", [])
    masks = body.pop("mask", None)
    body.pop("input_fidelity", None)  # OpenAI's gpt-image option: the reference pipelines have none
    if masks is not None and len(masks) != 1:
        raise bad_field("mask", f"{len(masks)} masks given; send one")
    fields, opts = image_request(body, info)
    fields["image"] = images or None
    fields["mask_image"] = masks[0] if masks else None
    return fields, opts


def input_reference(value: Any, name: str = "input_reference") -> bytes | None:
    """A video body's `input_reference` (or `last_image`, `name`) -> the image file's bytes: one
    multipart part (a file, or a text part holding a data URL), or a JSON string
    `data:<type>;base64,<data>`."""
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(v, bytes) for v in value):  # multipart parts
        if len(value) != 1:
            raise bad_field(name, f"{len(value)} parts given; send one image")
        value = value[0]
        if not value.startswith(DATA_URL.encode()):
            return value
        value = value.decode("ascii", "replace")
    if not isinstance(value, str) or not value.startswith(DATA_URL):
        raise bad_field(name, "must be an image file part or a data URL "
                              "(data:image/png;base64,...); URLs and file ids are not fetched")
    head, comma, data = value.partition(",")
    if not comma or not head.endswith(";base64"):
        raise bad_field(name, "a data URL must be base64: data:<type>;base64,<data>")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise bad_field(name, "the data URL's base64 is damaged") from None


def video_request(body: Any, info, fps: float) -> tuple[dict[str, Any], dict[str, str]]:
    """(Admission.admit values without request_id, {field: body field} for a field set from
    another body field) of a `POST /v1/videos` body; `seconds` sets the frame count at `fps`;
    `input_reference` is the request's `image` (decoded and checked by admission)."""
    fields = _common(body, info, VIDEO_FIELDS)
    image = input_reference(body.get("input_reference"))
    last = input_reference(body.get("last_image"), "last_image")
    if last is not None and image is None:
        raise bad_field("last_image", "needs input_reference, the first frame, beside it")
    fields["image"] = None if image is None else [image] + ([last] if last is not None else [])
    spelled = {"image": "input_reference"}
    rate = _number(body, "fps")
    if rate is not None and rate != fps:
        raise bad_field("fps", f"{rate:g} is not served: this model writes {fps:g} fps")
    seconds = _type(body, "seconds", (str, int, float), "a number of seconds")
    if seconds is None:
        return fields, spelled
    try:
        value = float(seconds)
    except ValueError:
        raise bad_field("seconds", f"{seconds!r} is not a number") from None
    frames = round(value * fps) if math.isfinite(value) else 0  # the nearest frame count: any spelling
    if frames < 1:
        raise bad_field("seconds", f"{seconds} is not a positive length")
    given = fields.get("frames")
    if given is not None and given != frames:
        raise bad_field("seconds", f"{seconds} is not {HTTP_NAME['frames']} {given} at {fps:g} fps "
                                   f"({given / fps:g} s)")
    fields["frames"] = frames
    return fields, spelled if given is not None else {**spelled, "frames": "seconds"}
