"""The one request schema: every per-request field of a generation, declared once in `Request`.

Each field states its name, type, default, range and meaning (a msgspec `Meta`: ge/le,
max_length, pattern, description) and, in `Meta.extra`, how the other faces spell it ("api": the
Python API's and difflet.Client's keyword, diffusers' name; "http": the HTTP body field, "" = not
on HTTP). Everything else is derived from it: the gRPC servicer's and the client's field lists,
the HTTP body fields, the Python API's keyword arguments, the CLI's options, and the model-process
message (messages.Run carries a `Request`); tests/test_request_schema.py checks difflet.proto's
GenerateRequest against it, field by field, both ways.

Invariants:
- `check(values)` is the only type and range check of a field: a rejection is a DiffletError
  whose `where` is the field and whose message starts with it ("steps: 0 is outside [1, 1000]").
  A value None means "not given" (the field's default), on every face.
- What depends on the serving profile (sizes, profile defaults, the cache mode's syntax) is
  validate.resolve_request's; a `Request` that passed it has every default resolved (steps,
  guidance, height, width, request_id; frames for a video), so the model process takes it as is.
- Input images (`image`, `mask_image`: MEDIA) are `Pixels`, decoded and resized once in the API
  process (runtime/images.py, by validate.resolve_request); every face hands their encoded bytes
  (or, in the Python API, PIL images) to resolve_request, so they are not `FIELDS`.
- Torch-free: the API process and the host steps both import it.
"""
from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Mapping, Optional

import msgspec
from msgspec import Meta

from difflet.errors import DiffletError

MAX_SEED = 2**63 - 1
# Far past what any family's text encoder reads (1024 tokens at most), and checked before a
# tokenizer sees the text: a 1 MiB prompt took seconds and hundreds of MB to count (issue 31 finding 4)
MAX_PROMPT_CHARS = 32768


class Pixels(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A decoded input image at the request's size: `data` is height * width * channels uint8,
    row-major, channels 3 for mode "RGB" and 1 for "L" (a mask)."""

    width: int
    height: int
    mode: str
    data: bytes


MEDIA = ("image", "mask_image")  # Request's image fields (Pixels) the faces take, outside FIELDS
DERIVED = ("image_original",)  # set by validate.resolve_request from the media, never by a face


class Request(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One generation request; unset markers (None, 0, "") mean the server's or profile's default."""

    prompt: Annotated[str, Meta(pattern=r"\S", max_length=MAX_PROMPT_CHARS, extra={"means": "a non-empty string"}, description=(
        "the text to generate from; each text encoder truncates it at its compiled max_length"))]
    seed: Annotated[int, Meta(ge=0, le=MAX_SEED, description=(
        "seeds a CPU torch.Generator exactly like the reference pipeline"))] = 0
    steps: Optional[Annotated[int, Meta(ge=1, le=1000, extra={"api": "num_inference_steps", "http":
                    "num_inference_steps"}, description="denoising steps (default: the profile's)")]] = None
    guidance: Optional[Annotated[float, Meta(ge=0, le=100, extra={"api": "guidance_scale",
                                                                   "http": "guidance_scale"},
                       description="guidance scale, at most 100 (default: the profile's)")]] = None
    guidance_2: Optional[Annotated[float, Meta(ge=0, le=100, extra={"api": "guidance_scale_2",
                                                                     "http": "guidance_scale_2"},
                         description=("two-expert models (Wan 2.2 A14B): the low-noise expert's guidance scale "
                                      "(default: `guidance` when that is given, else the profile's)"))]] = None
    stg_scale: Optional[Annotated[float, Meta(ge=0, le=100, description=(
        "LTX-2 (`stg_scale` in the profile): the video stream's spatio-temporal guidance scale, as "
        "LTX2Pipeline's stg_scale; 0 = off (default: the profile's)"))]] = None
    modality_scale: Optional[Annotated[float, Meta(ge=0, le=100, description=(
        "LTX-2 (`modality_scale` in the profile): the video stream's modality-isolation guidance "
        "scale, as LTX2Pipeline's modality_scale; 1 = off (default: the profile's)"))]] = None
    height: Annotated[int, Meta(ge=0, extra={"http": "size"}, description=(
        "one of the served sizes (0 = the default size)"))] = 0
    width: Annotated[int, Meta(ge=0, extra={"http": "size"}, description=(
        "one of the served sizes (0 = the default size)"))] = 0
    frames: Annotated[int, Meta(ge=0, extra={"api": "num_frames", "http": "num_frames"}, description=(
        "video: a frame count served at this size (0 = the size's default)"))] = 0
    negative_prompt: Optional[Annotated[str, Meta(max_length=MAX_PROMPT_CHARS, description=(
        "true-CFG models: the negative prompt (default: the model family's)"))]] = None
    cache: Annotated[str, Meta(description=(
        "step-cache override: off | cadence:N | online-delta:ALPHA | calibrated:NAME[:THRESHOLD] | "
        "block[:THRESHOLD] (an artifact built with --front-blocks), "
        "each optionally followed by +forecast[:K] (K 0-2) and +keep:INITIAL:FINAL "
        "(NAME: a server's --calibration; the Python API takes a file) (default: the server's mode)"))] = ""
    lora: Annotated[str, Meta(max_length=96, pattern=r"^$|^[A-Za-z0-9_.-]{1,64}(:[-+]?[0-9]+(\.[0-9]*)?)?$", extra={
        "means": "NAME or NAME:SCALE"}, description=(
        "a LoRA adapter the server loaded (--lora NAME=PATH), at its scale or SCALE in [-8, 8]; "
        "\"\" = the base weights"))] = ""
    strength: Optional[Annotated[float, Meta(gt=0, le=1, description=(
        "image-to-image and inpainting: how far the input image is noised, (0, 1]; the steps run "
        "are int(steps x strength) (default: the profile's)"))]] = None
    request_id: Annotated[str, Meta(max_length=128, pattern=r"^[ -~]*$", extra={
        "means": "printable ASCII", "http": ""}, description=(
        "echoed back; the server makes one when empty; unique among the requests in flight"))] = ""
    image: tuple[Pixels, ...] = ()  # the input image(s) of an image-input profile, at the request's size
    mask_image: Optional[Pixels] = None  # inpainting: white = repaint, black = keep
    # the input image(s) as decoded, unresized: for a profile whose pipeline also reads the
    # original (`image_original = true`: e.g. a CLIP image processor that crops from it)
    image_original: tuple[Pixels, ...] = ()


@dataclass(frozen=True)
class Field:
    """One `Request` field as the faces read it (derived from the Struct's declaration)."""

    name: str
    kind: type  # int | float | str
    optional: bool  # None is a value of it (unset = the server's or profile's default)
    required: bool
    default: Any
    limits: Any  # msgspec.inspect IntType / FloatType / StrType: ge, le, max_length, pattern
    doc: str
    api: str  # the Python API's / difflet.Client's keyword
    http: str  # the HTTP body field; "" = not accepted over HTTP
    means: str  # what its pattern asks for, in words

    def fail(self, message: str) -> DiffletError:
        return DiffletError(f"{self.name}: {message}", where=self.name)

    def check(self, value: Any) -> Any:
        """`value` checked against this field's type and range (an int is taken as a float)."""
        lim = self.limits
        if self.kind is str:
            if not isinstance(value, str):
                raise self.fail(f"must be a string, not {type(value).__name__} {value!r}")
            if lim.max_length is not None and len(value) > lim.max_length:
                raise self.fail(f"is {len(value)} characters, at most {lim.max_length}")
            if lim.pattern is not None and not re.search(lim.pattern, value):  # msgspec's own semantics
                raise self.fail(f"must be {self.means}")
            return value
        number = (int,) if self.kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, number):
            what = "an integer" if self.kind is int else "a number"
            raise self.fail(f"must be {what}, not {type(value).__name__} {value!r}")
        value = self.kind(value)
        low, high, above = lim.ge, lim.le, getattr(lim, "gt", None)  # gt: an open bound (strength)
        inside = ((low is None or value >= low) and (high is None or value <= high)
                  and (above is None or value > above))
        if self.kind is float and not (math.isfinite(value) and inside):
            bound = (f"in ({above}, {high}]" if above is not None else f">= {low}" if high is None
                     else f"<= {high}" if low is None else f"in [{low}, {high}]")
            raise self.fail(f"{value} must be finite and {bound}")
        if not inside:
            raise self.fail(f"{value} is outside [{low}, {high}]" if None not in (low, high)
                            else f"{value} must be >= {low}" if high is None else f"{value} must be <= {high}")
        return value


def _fields() -> tuple[Field, ...]:
    out = []
    for f in msgspec.inspect.type_info(Request).fields:
        if f.name in MEDIA or f.name in DERIVED:
            continue
        t, optional = f.type, False
        if isinstance(t, msgspec.inspect.UnionType):
            t, optional = next(x for x in t.types if not isinstance(x, msgspec.inspect.NoneType)), True
        meta = t if isinstance(t, msgspec.inspect.Metadata) else None
        limits = meta.type if meta else t
        extra = (meta.extra or {}) if meta else {}
        kind = {msgspec.inspect.IntType: int, msgspec.inspect.FloatType: float,
                msgspec.inspect.StrType: str}[type(limits)]
        unread = [k for k in ("lt", "multiple_of", "min_length") if getattr(limits, k, None) is not None]
        if unread or (getattr(limits, "gt", None) is not None and kind is not float):
            # a declared range nobody checks would be a silent lie
            raise TypeError(f"Request.{f.name}: Field.check reads ge/le/gt (floats)/max_length/pattern, not {unread}")
        out.append(Field(f.name, kind, optional, f.required, None if f.required else f.default, limits,
                         (meta.extra_json_schema or {}).get("description", "") if meta else "",
                         extra.get("api", f.name), extra.get("http", f.name), extra.get("means", "")))
    return tuple(out)


FIELDS = _fields()
BY_NAME = {f.name: f for f in FIELDS}


def names(face: str) -> dict[str, str]:
    """field name -> its spelling on `face` ("api" or "http"; a field a face lacks is left out)."""
    return {f.name: getattr(f, face) for f in FIELDS if getattr(f, face)}


def check(values: Mapping[str, Any]) -> Request:
    """`values` (field name -> value; None = not given) as a `Request`, each value checked against
    its field's declaration; raises DiffletError naming the first bad or unknown field."""
    for name in values:
        if name not in BY_NAME:
            raise DiffletError(f"{name}: unknown request field (fields: {', '.join(BY_NAME)})", where=name)
    given = {}
    for f in FIELDS:
        value = values.get(f.name)
        if value is None and f.required:
            raise f.fail("is required")
        if value is not None:
            given[f.name] = f.check(value)
    return Request(**given)


def from_arguments(arguments: Mapping[str, Any], what: str) -> dict[str, Any]:
    """Python keyword arguments (the "api" spelling) -> field values; an unknown keyword is the
    TypeError Python raises for one, naming `what` and the keywords it takes."""
    fields = {api: name for name, api in names("api").items()}
    unknown = [k for k in arguments if k not in fields]
    if unknown:
        raise TypeError(f"{what}() got an unexpected keyword argument {unknown[0]!r} "
                        f"(request arguments: {', '.join(fields)})")
    return {fields[k]: v for k, v in arguments.items()}


def with_arguments(fn: Callable) -> Callable:
    """`fn(..., **arguments)` with a signature that lists each request field's keyword (for
    help() and editors), every field `fn` does not already name, keyword-only, at its default."""
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    taken = {p.name for p in own}
    extra = [inspect.Parameter(f.api, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                               annotation=f"{f.kind.__name__} | None" if f.optional else f.kind.__name__)
             for f in FIELDS if f.api not in taken and not f.required]
    fn.__signature__ = sig.replace(parameters=own + extra)
    return fn
