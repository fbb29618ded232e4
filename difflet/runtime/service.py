"""The gRPC face of the dispatcher: `difflet.v1.Difflet` (Generate, GenerateStream, Cancel,
GetProfile). Runs in the API process; torch-free.

Invariants:
- The servicer only translates: proto request (request.Request's fields, by the same names)
  -> `Admission.check` -> `Dispatcher.submit` -> wait for the job's answer -> proto reply.
  Validation errors are INVALID_ARGUMENT with the field-named message as details (and never
  reach the queue); a full queue is RESOURCE_EXHAUSTED at once; before the first warm-up
  passed, after recovery failed, or during shutdown, UNAVAILABLE.
- The deadline of a request is the earlier of the gRPC deadline and --request-timeout, counted
  from admission (queue time included). The handler itself answers DEADLINE_EXCEEDED when it
  passes, whatever the model process is doing; the dispatcher then asks the process to stop.
- A call that ends early (client cancel or disconnect) cancels its job.
- The reply's `truncated` lists admission's truncations of this request (which encoder kept how
  many of how many tokens); each truncated request is logged as one warning line.
"""
from __future__ import annotations

import logging
import time
from typing import Callable

import grpc

from difflet.errors import DiffletError
from difflet.ir.buckets import base_name
from difflet.runtime import difflet_pb2 as pb
from difflet.runtime import difflet_pb2_grpc as pb_grpc
from difflet.runtime.dispatcher import Rejected
from difflet.runtime.request import FIELDS
from difflet.runtime.validate import MAX_TIMEOUT_S

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Difflet"].full_name  # "difflet.v1.Difflet"
_PROFILE_FIELDS = ("height", "width", "steps", "guidance", "max_text", "dtype")
_CODES = {"invalid": grpc.StatusCode.INVALID_ARGUMENT, "internal": grpc.StatusCode.INTERNAL,
          "cancelled": grpc.StatusCode.CANCELLED, "deadline": grpc.StatusCode.DEADLINE_EXCEEDED,
          "unavailable": grpc.StatusCode.UNAVAILABLE}
_REJECT_CODES = {"queue_full": grpc.StatusCode.RESOURCE_EXHAUSTED,
                 "unavailable": grpc.StatusCode.UNAVAILABLE,
                 "duplicate_id": grpc.StatusCode.INVALID_ARGUMENT}
_NO_DEADLINE = 1e8  # time_remaining() of a call without a deadline is huge or None
log = logging.getLogger("difflet.runtime")


def request_values(request: pb.GenerateRequest) -> dict:
    """The schema's fields of a GenerateRequest (an unset `optional` one is None: not given), and
    its input images as encoded bytes (decoded once, by admission)."""
    values = {f.name: getattr(request, f.name) for f in FIELDS if not f.optional or request.HasField(f.name)}
    values["image"] = list(request.image) or None
    values["mask_image"] = request.mask_image if request.HasField("mask_image") else None
    return values


class DiffletServicer(pb_grpc.DiffletServicer):
    """Translates calls; `admission`, `dispatcher` and `serving_state` are set by the server."""

    def __init__(self, info, admission, dispatcher, metrics, *, request_timeout: float | None,
                 cache: str, serving_state: Callable[[], pb.ServingState], keys) -> None:
        """`keys`: the server's http.auth.Keys: a call's key is its owner (request ids and Cancel
        are scoped to it)."""
        self.info, self.admission, self.dispatcher, self.metrics = info, admission, dispatcher, metrics
        self.request_timeout, self.cache, self.serving_state = request_timeout, cache, serving_state
        self.keys = keys

    # ---- admission
    def _admit(self, request: pb.GenerateRequest, context: grpc.ServicerContext):
        try:
            fields, cuts = self.admission.admit(**request_values(request))
        except DiffletError as err:
            self.metrics.rejected("invalid_argument")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, err.message)
        try:
            job = self.dispatcher.submit(fields, self._deadline(context), owner=self.keys.owner_of_call(context))
        except Rejected as rej:
            self.metrics.rejected(rej.reason)
            context.abort(_REJECT_CODES[rej.reason], rej.message)
        context.add_callback(lambda: self._call_ended(job))
        if cuts:
            log.warning("request %s: prompt truncated: %s", job.request_id,
                        "; ".join(cut.describe() for cut in cuts))
        return job, [pb.PromptTruncation(field=c.field, encoder=c.encoder, tokens=c.tokens,
                                         kept=c.limit, dropped=c.dropped) for c in cuts]

    def _call_ended(self, job) -> None:
        """gRPC ended the call (client cancel, disconnect, or its deadline): drop the job."""
        if job.deadline is not None and time.monotonic() >= job.deadline - 0.01:
            self.dispatcher.expire(job)  # the deadline, seen by gRPC a moment before our timer
        else:
            self.dispatcher.cancel(job, "cancelled", "the call ended before its answer")

    def _deadline(self, context: grpc.ServicerContext) -> float | None:
        limits = []
        remaining = context.time_remaining()
        if remaining is not None and remaining < _NO_DEADLINE:
            limits.append(min(remaining, MAX_TIMEOUT_S))  # a deadline past the bound is the bound
        if self.request_timeout:
            limits.append(self.request_timeout)
        return time.monotonic() + min(limits) if limits else None

    def _wait(self, job) -> None:
        if job.deadline is None:
            job.done.wait()
        elif not job.done.wait(max(0.0, job.deadline - time.monotonic())):
            self.dispatcher.expire(job)

    def _reply(self, job, truncated, context: grpc.ServicerContext) -> pb.GenerateReply:
        if job.code != "ok":
            context.abort(_CODES[job.code], job.message)
        r, t = job.result, job.result["timings"]
        return pb.GenerateReply(
            png=r["png"], mp4=r.get("mp4", b""), frames=r.get("frames", 0), fps=r.get("fps", 0.0),
            seed=r["seed"], steps=r["steps"], guidance=r["guidance"],
            height=r["height"], width=r["width"], request_id=r["request_id"],
            cached_steps=r["cached_steps"], denoiser_calls=r["denoiser_calls"], cache=r["cache"],
            model_pid=job.pid, replica=job.replica, truncated=truncated,
            timings=pb.Timings(encode_ms=t.get("encode", 0.0), denoise_ms=t.get("denoise", 0.0),
                               decode_ms=t.get("decode", 0.0), total_ms=t.get("total", 0.0),
                               queue_ms=job.queue_ms))

    # ---- RPCs
    def Generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext) -> pb.GenerateReply:
        job, truncated = self._admit(request, context)
        self._wait(job)
        return self._reply(job, truncated, context)

    def GenerateStream(self, request: pb.GenerateRequest, context: grpc.ServicerContext):
        job, truncated = self._admit(request, context)
        for event in self.dispatcher.events(job):  # every event up to "end" is shown
            if event[0] == "queued":
                yield pb.GenerateEvent(queued=pb.Queued(request_id=job.request_id, position=event[1]))
            elif event[0] == "progress":
                _, step, total, cached, pid = event
                yield pb.GenerateEvent(progress=pb.Progress(
                    request_id=job.request_id, step=step, total=total, cached=cached, model_pid=pid))
        yield pb.GenerateEvent(result=self._reply(job, truncated, context))

    def Cancel(self, request: pb.CancelRequest, context: grpc.ServicerContext) -> pb.CancelReply:
        if not request.request_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id: must be non-empty")
        state = self.dispatcher.cancel_id(request.request_id, self.keys.owner_of_call(context))
        return pb.CancelReply(found=bool(state), state=state)

    def GetProfile(self, request: pb.GetProfileRequest, context: grpc.ServicerContext) -> pb.Profile:
        module, profile = self.info.module, self.info.profile
        parallel = module.attrs.get("parallel")
        return pb.Profile(
            model=module.name, family=str(module.attrs.get("family", "")),
            height=int(profile["height"]), width=int(profile["width"]), steps=int(profile["steps"]),
            guidance=float(profile["guidance"]), max_text=int(profile.get("max_text", 0)),
            dtype=str(profile.get("dtype", "")),
            parallel=str(parallel.to_python() if hasattr(parallel, "to_python") else parallel or ""),
            target=str(module.attrs.get("target", "")),
            components=list(dict.fromkeys(base_name(c) for c in module.components())),
            attrs={k: str(v) for k, v in profile.items() if k not in _PROFILE_FIELDS},
            cache=self.cache, prompt_tokens=self.admission.token_limit,
            prompt_policy=self.admission.prompt_policy,
            serving=self.serving_state(), sizes=list(self.info.manifest.sizes))
