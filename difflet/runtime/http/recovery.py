"""What a restarted server does with the video jobs its state dir recorded as queued (the
rest of recovery is VideoJobs._restore): each is checked against this server and submitted
again, or refused with the reason.

Invariants:
- A resubmitted job is the saved Request (decoded with its schema, so every field's type and
  range is checked again) admitted again by this server's Admission, with the same request id,
  and its deadline still counted from its first admission (wall clock).
- Refused (never run): another served model, a request this server does not accept, a deadline
  that passed while the server was down, a dispatcher refusal (full queue, unavailable).
"""
from __future__ import annotations

import time

import msgspec

from difflet.errors import DiffletError

INTERRUPTED = {"code": "interrupted", "message": (
    "the server stopped while this job was running in a model process; it was not run again "
    "(submit it again to retry)")}


class Refused(Exception):
    """A restored job that is not submitted again: it fails with `code` and `message`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def submit_again(dispatcher, admission, model: str, video):
    """The dispatcher Job of restored queued `video` (its `saved` row); Refused if it may not run.
    `admission` None (no server around it) submits the saved request as it is."""
    from difflet.runtime.dispatcher import Rejected
    from difflet.runtime.image_fields import face_values
    from difflet.runtime.request import Request

    if model and video.model != model:
        raise Refused("unavailable", f"the server now serves {model!r}, not {video.model!r}; the job was not run")
    try:
        request = msgspec.json.decode(video.saved["request"], type=Request)
        if admission is not None:
            request, _ = admission.admit(**face_values(request))
    except (msgspec.DecodeError, DiffletError) as err:
        raise Refused("invalid", f"after the restart the request is not valid on this server: {err}") from None
    deadline = video.saved["deadline"]
    if deadline is not None and deadline <= time.time():
        raise Refused("deadline", "the request deadline passed while the server was down")
    try:
        return dispatcher.submit(request, None if deadline is None else time.monotonic() + deadline - time.time(),
                                 owner=video.owner)
    except Rejected as rej:
        raise Refused(rej.reason, f"not queued again after the restart: {rej.message}") from None
