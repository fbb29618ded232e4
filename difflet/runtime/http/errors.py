"""OpenAI error objects and the mapping from Difflet's refusals to HTTP statuses.

Invariant: every error reply is `{"error": {"message", "type", "param", "code"}}`; a 400 names
the request field (`param`) in the HTTP API's own vocabulary (num_inference_steps, not steps).
"""
from __future__ import annotations

from difflet.runtime.request import names

PARAM_NAMES = names("http")  # Admission's field names -> the HTTP field a client sent
# a finished Job's code -> (HTTP status, OpenAI error type)
JOB_STATUS = {"invalid": (400, "invalid_request_error"), "internal": (500, "server_error"),
              "cancelled": (409, "request_cancelled"), "deadline": (504, "timeout"),
              "unavailable": (503, "service_unavailable")}
# Dispatcher's Rejected.reason -> (HTTP status, type)
REJECT_STATUS = {"queue_full": (429, "rate_limit_exceeded"),
                 "unavailable": (503, "service_unavailable"),
                 "duplicate_id": (409, "invalid_request_error")}


class ApiError(Exception):
    """An HTTP error reply; `param` is the offending request field (400) or None."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_field(param: str, message: str) -> ApiError:
    """A 400 naming `param`; the message starts with it, like gRPC's INVALID_ARGUMENT details."""
    return ApiError(400, f"{param}: {message}", "invalid_request_error", param, "invalid_value")


def from_admission(err) -> ApiError:
    """A DiffletError from Admission.check (where = its field name) -> a 400 naming the HTTP field."""
    where = err.where if isinstance(err.where, str) else ""
    param = PARAM_NAMES.get(where, where) or None
    message = err.message
    if param and where != param and message.startswith(f"{where}:"):
        message = f"{param}:{message[len(where) + 1:]}"
    return ApiError(400, message, "invalid_request_error", param, "invalid_value")


def from_job(code: str, message: str) -> ApiError:
    """A job answered with something other than ok -> its HTTP error."""
    status, type_ = JOB_STATUS[code]
    param = None
    if code == "invalid":  # a runner-side check (e.g. a calibration file): message starts with the field
        head = message.split(":", 1)[0]
        param = PARAM_NAMES.get(head, head) if head.isidentifier() else None
    return ApiError(status, message, type_, param, code)


def from_rejected(rej) -> ApiError:
    status, type_ = REJECT_STATUS[rej.reason]
    return ApiError(status, rej.message, type_, None, rej.reason)
