"""Messages between the API process and a model process: msgspec Structs sent as msgpack bytes.

One definition per message; torch-free (both processes import it). Each message is a tagged
Struct (the tag is its kind), so the receiver decodes with a tagged Union: an unknown kind, a
missing field or a field of the wrong type is a `msgspec.ValidationError`, never a default.

  API -> model:  Run(seq, fields: Request) | Cancel(seq) | Stop
  model -> API:  Ready(pid, load_s, warm_up_s, compiles) | Failed(kind, message)   once, at start
                 Step(seq, step, total, cached)                                    after each step
                 Done(seq, result: Result) | Error(seq, kind, message) | Cancelled(seq)

Invariants:
- `Run.fields` is exactly the `request.Request` that `admission.Admission.check` returned:
  valid and resolved once, in the API process; decoding it still checks every field's type and
  declared range (msgspec applies the schema's Meta), so a malformed one never runs.
- What the API process computes about a request itself (e.g. a prompt-truncation report)
  stays in the API process (on the Job / the reply) and does not cross the pipe.
- `Result` carries no tensors: the encoded output (png or mp4) and plain numbers only.
"""
from __future__ import annotations

from typing import Union

import msgspec

from difflet.runtime.request import Request


class Result(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A finished generation: the encoded output and what the reply reports about it."""

    png: bytes
    mp4: bytes
    fps: float
    frames: int
    seed: int
    steps: int
    guidance: float
    height: int
    width: int
    request_id: str
    timings: dict[str, float]  # encode/denoise/decode/total, milliseconds
    cache: str
    denoiser_calls: int
    cached_steps: int
    compiles: int
    batch_rows: int = 1  # the most requests any of its batched denoiser calls carried


class Run(msgspec.Struct, tag="run", frozen=True, forbid_unknown_fields=True):
    seq: int
    fields: Request


class Cancel(msgspec.Struct, tag="cancel", frozen=True, forbid_unknown_fields=True):
    """Stop request `seq` at its next step boundary (no-op if it already ended)."""

    seq: int


class Stop(msgspec.Struct, tag="stop", frozen=True, forbid_unknown_fields=True):
    pass


class Ready(msgspec.Struct, tag="ready", frozen=True, forbid_unknown_fields=True):
    pid: int
    load_s: float
    warm_up_s: float
    compiles: int
    import_s: float = 0.0  # process start -> runtime imported (torch, host steps), for timings


class Failed(msgspec.Struct, tag="failed", frozen=True, forbid_unknown_fields=True):
    kind: str  # "invalid" (a refused artifact) | "error"
    message: str


class Step(msgspec.Struct, tag="step", frozen=True, forbid_unknown_fields=True):
    seq: int
    step: int  # 1-based
    total: int
    cached: bool


class Done(msgspec.Struct, tag="done", frozen=True, forbid_unknown_fields=True):
    seq: int
    result: Result


class Error(msgspec.Struct, tag="error", frozen=True, forbid_unknown_fields=True):
    seq: int
    kind: str  # "invalid" | "internal"
    message: str


class Cancelled(msgspec.Struct, tag="cancelled", frozen=True, forbid_unknown_fields=True):
    seq: int


ToModel = Union[Run, Cancel, Stop]
ToApi = Union[Ready, Failed, Step, Done, Error, Cancelled]

_to_model = msgspec.msgpack.Decoder(ToModel)
_to_api = msgspec.msgpack.Decoder(ToApi)


def encode(message: ToModel | ToApi) -> bytes:
    return msgspec.msgpack.encode(message)


def decode_to_model(data: bytes) -> ToModel:
    """A message for the model process; msgspec.ValidationError if it is not one."""
    return _to_model.decode(data)


def decode_to_api(data: bytes) -> ToApi:
    """A message for the API process; msgspec.ValidationError if it is not one."""
    return _to_api.decode(data)

