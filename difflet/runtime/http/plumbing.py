"""What every HTTP route shares: the API-key check, OpenAI error replies, reading a bounded body,
waiting for a job without blocking the event loop, and Server-Sent Events.

Invariants:
- The API key (when set) is checked from the headers before routing and before the body is
  read (`KeyCheck`, an ASGI middleware); a refused request never reaches admission (401, the
  connection closed, counted `unauthenticated`). PUBLIC paths need no key. The key's owner tag
  (auth.Keys) is the request's `owner`: what it makes is scoped to it.
- Every error reply is OpenAI-shaped (errors.ApiError). An unexpected exception is a 500 that
  names an incident id and carries no exception text; the traceback goes to the server log.
- A body needs a Content-Length of at most MAX_BODY (411/413 otherwise, before it is read) and
  must arrive within BODY_TIMEOUT_S (408).
- Waiting for a job holds neither the event loop nor a worker thread: the job's watchers raise
  a `Wake`; the deadline expires the job (Dispatcher.expire), a client disconnect cancels it.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import queue
import secrets
import time

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from difflet.errors import DiffletError
from difflet.runtime.dispatcher import Rejected
from difflet.runtime.http import fields as F
from difflet.runtime.http.errors import ApiError, from_rejected

log = logging.getLogger("difflet.runtime")  # the gRPC servicer's logger: one log for both fronts
MAX_BODY = 1 << 20
BODY_TIMEOUT_S = 30.0
PUBLIC = {"/", "/health", "/openapi.json", "/docs"}  # a static page, liveness, the API's description


def error_response(err: ApiError) -> JSONResponse:
    headers = {}
    if err.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if err.status in (401, 408, 411, 413):  # the body was not read (or not whole): nothing follows
        headers["Connection"] = "close"
    return JSONResponse(err.body(), err.status, headers)


def incident(what: str) -> JSONResponse:
    """A 500 for a bug: logged with its traceback and an id; the client sees only the id."""
    ident = secrets.token_hex(8)
    log.exception("HTTP %s failed (incident %s)", what, ident)
    return error_response(ApiError(500, f"internal error (incident {ident}, in the server log)",
                                   "server_error", None, "internal"))


class KeyCheck:
    """ASGI middleware: the key from the headers, before routing; trailing slashes dropped."""

    def __init__(self, app, api) -> None:
        self.app, self.api = app, api

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            path = scope["path"].rstrip("/") or "/"
            scope["path"] = path
            found = self.api.keys.owner(dict(scope["headers"]).get(b"authorization", b""))
            scope.setdefault("state", {})["owner"] = found or ""
            if found is None and path not in PUBLIC:
                self.api.metrics.rejected("unauthenticated")
                err = ApiError(401, "a valid API key is required (Authorization: Bearer KEY)",
                               "invalid_request_error", None, "invalid_api_key")
                return await error_response(err)(scope, receive, send)
        await self.app(scope, receive, send)


def owner(request: Request) -> str:
    """The owner tag of the request's API key ("" without keys): see auth.Keys."""
    return request.scope.get("state", {}).get("owner", "")


def get(app, path: str, **kw):
    """Register a GET route that also answers HEAD; only GET is in the spec (one operation id)."""
    def register(fn):
        app.add_api_route(path, fn, methods=["GET"], **kw)
        app.add_api_route(path, fn, methods=["HEAD"], include_in_schema=False)
        return fn
    return register


def endpoint(fn):
    """A route: its ApiError is the reply; a vanished client gets none; anything else is a 500."""
    @functools.wraps(fn)
    async def run(request: Request, *args, **kwargs):
        try:
            return await fn(request, *args, **kwargs)
        except ApiError as err:
            return error_response(err)
        except ClientDisconnect:
            return Response(status_code=400)  # never delivered: the client is gone
        except Exception:
            return incident(f"{request.method} {request.url.path}")
    return run


async def read_body(request: Request, limit: int = MAX_BODY, files: tuple[str, ...] = ()):
    """The request body as its JSON value (a multipart form as the dict of its fields; `files`:
    the file parts taken, as lists of bytes), at most `limit` bytes."""
    length = request.headers.get("content-length")
    if length is None or not length.isdigit():
        raise ApiError(411, "a Content-Length header is required", code="length_required")
    if int(length) > limit:
        raise ApiError(413, f"the body is {length} bytes, at most {limit}", code="too_large")
    try:
        raw = await asyncio.wait_for(request.body(), BODY_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the body did not arrive within {BODY_TIMEOUT_S:g} s", code="timeout") from None
    return F.decode_body(request.headers.get("content-type", ""), raw, files)


async def in_thread(fn, *args):
    """`fn(*args)` in a worker thread (blocking work: admission's tokenizers, files, encoders)."""
    return await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


def parse(api, parser, *args):
    """A body parser's result; its 400/404 counts as an invalid_argument reject, like gRPC's."""
    try:
        return parser(*args)
    except ApiError:
        api.metrics.rejected("invalid_argument")
        raise


async def submit(api, request: Request, fields: dict, request_id: str, timeout, spelled: dict | None = None):
    """(the admitted job, what admission cut of its prompt), owned by the request's key; the cut
    is logged as gRPC logs it. `spelled`: field -> the body field it came from, where that is
    another one."""
    try:
        checked, cuts = await in_thread(lambda: api.admission.admit(**fields, request_id=request_id))
    except DiffletError as err:
        api.metrics.rejected("invalid_argument")
        raise F.refusal(err, fields, api.info, spelled or {}) from None
    limits = [t for t in (timeout, api.request_timeout) if t]
    deadline = time.monotonic() + min(limits) if limits else None
    try:
        job = api.dispatcher.submit(checked, deadline, owner(request))
    except Rejected as rej:
        api.metrics.rejected(rej.reason)
        raise from_rejected(rej) from None
    if cuts:
        log.warning("request %s: prompt truncated: %s", job.request_id,
                    "; ".join(cut.describe() for cut in cuts))
    return job, [{"field": c.field, "encoder": c.encoder, "tokens": c.tokens, "kept": c.limit,
                  "dropped": c.dropped} for c in cuts]


class Wake:
    """An asyncio flag any thread can raise (a Job's or a video's watcher): a waiting request holds
    no worker thread. Lower it (`arm`) before looking at the state, then `wait`: a change made
    after the look raises it again, so none is missed."""

    def __init__(self) -> None:
        self.loop, self.flag = asyncio.get_running_loop(), asyncio.Event()

    def __call__(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.flag.set)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass

    def arm(self) -> None:
        self.flag.clear()

    async def wait(self, timeout: float | None, *others: asyncio.Future) -> None:
        waiter = asyncio.ensure_future(self.flag.wait())
        try:
            await asyncio.wait({waiter, *others}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _until_deadline(jobs) -> float | None:
    ends = [j.deadline for j in jobs if j.deadline is not None and not j.done.is_set()]
    return max(0.0, min(ends) - time.monotonic()) if ends else None


async def wait_jobs(request: Request, dispatcher, jobs) -> None:
    """Until every job is answered; each expires at its deadline; all are cancelled if the client
    disconnects (seen as the transport's disconnect: a half-closed client is still there)."""
    wake, gone = Wake(), asyncio.ensure_future(_disconnected(request))
    for job in jobs:
        job.watchers.append(wake)
    try:
        while True:
            wake.arm()
            if all(j.done.is_set() for j in jobs):
                return
            await wake.wait(_until_deadline(jobs), gone)
            for job in jobs:
                if job.deadline is not None and time.monotonic() >= job.deadline:
                    dispatcher.expire(job)
            if gone.done():
                for job in jobs:
                    dispatcher.cancel(job, "cancelled", "the client disconnected")
                return
    finally:
        gone.cancel()
        for job in jobs:
            job.watchers.remove(wake)


def sse_line(obj) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


SSE_HEADERS = {"Cache-Control": "no-store", "Connection": "close"}


async def job_events(dispatcher, job):
    """Dispatcher.events(job) as an async iterator: every event up to "end"; the job expires at
    its deadline while it is waited on."""
    wake = Wake()
    job.watchers.append(wake)
    try:
        while True:
            wake.arm()
            try:
                event = job.events.get_nowait()
            except queue.Empty:
                await wake.wait(_until_deadline([job]))
                if job.deadline is not None and time.monotonic() >= job.deadline:
                    dispatcher.expire(job)  # queues "end" (a no-op when answered)
                continue
            if event[0] == "end":
                return
            yield event
    finally:
        job.watchers.remove(wake)
