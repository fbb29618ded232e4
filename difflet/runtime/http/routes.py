"""The HTTP routes (one `BaseHTTPRequestHandler` per connection thread).

Invariants:
- The API key (when set) is checked from the headers before the body is read; a refused
  request never reaches admission (401 and the connection is closed).
- Images mirror `DiffletServicer.Generate`: Admission.admit (the only check of the request's
  fields, refusals phrased by fields.refusal) -> Dispatcher.submit -> wait until
  answered or the deadline (then Dispatcher.expire) -> reply; a client that disconnects while
  it waits cancels its job (plain-text connections; see docs/serving.md). `stream: true`
  answers Server-Sent Events: one per step, then the completed image.
- Refusals are counted in the shared metrics exactly as the gRPC servicer counts them.
- A truncated prompt is logged as gRPC logs it, and each image item carries `truncated` (field,
  encoder, tokens, kept, dropped), the gRPC reply's list.
"""
from __future__ import annotations

import base64
import hmac
import json
import logging
import secrets
import select
import socket
import ssl
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import urlsplit

from difflet.errors import DiffletError
from difflet.runtime.dispatcher import Rejected
from difflet.runtime.http import fields as F
from difflet.runtime.http.errors import ApiError, bad_field, from_job, from_rejected
from difflet.runtime.http.video_routes import VideoRoutes

log = logging.getLogger("difflet.runtime")  # the gRPC servicer's logger: one log for both fronts
PLAYGROUND = Path(__file__).with_name("playground.html")
MAX_BODY = 1 << 20
PUBLIC = {"/", "/health"}  # no key needed: a static page and a liveness probe
MIME = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp", "mp4": "video/mp4"}


class Handler(VideoRoutes, BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "difflet"
    api = None  # the HttpApi, set on the subclass the server makes

    # ---- plumbing
    def setup(self) -> None:
        super().setup()
        self._cuts: dict[str, list[dict]] = {}  # request id -> its prompt truncations (this connection)
        if isinstance(self.connection, ssl.SSLSocket):  # the handshake in this thread, not accept()
            self.connection.settimeout(30)
            self.connection.do_handshake()
            self.connection.settimeout(None)

    def log_message(self, format, *args) -> None:  # the access log stays off stdout/stderr
        pass

    def _send(self, status: int, body: bytes, ctype: str, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _error(self, err: ApiError) -> None:
        headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
        if err.status == 401:
            self.close_connection = True  # the body was never read
        self._send(err.status, json.dumps(err.body()).encode(), "application/json", headers)

    def _body(self):
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise ApiError(411, "a Content-Length header is required", code="length_required")
        if int(length) > MAX_BODY:
            self.close_connection = True
            raise ApiError(413, f"the body is {length} bytes, at most {MAX_BODY}", code="too_large")
        return F.decode_body(self.headers.get("Content-Type", ""), self.rfile.read(int(length)))

    def _authorized(self, path: str) -> bool:
        key = self.api.api_key
        if not key or path in PUBLIC:
            return True
        got = self.headers.get("Authorization", "")
        return got.startswith("Bearer ") and hmac.compare_digest(got[7:].strip().encode(), key.encode())

    def _route(self, method: str) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        try:
            if not self._authorized(path):
                self.api.metrics.rejected("unauthenticated")
                raise ApiError(401, "a valid API key is required (Authorization: Bearer KEY)",
                               "invalid_request_error", None, "invalid_api_key")
            parts = path.strip("/").split("/")
            handler = self._match(method, parts)
            if handler is None:
                raise ApiError(404, f"no route {method} {path}", code="not_found")
            handler(*parts)
        except ApiError as err:
            self._error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:  # a bug, not the client's mistake: an OpenAI-shaped 500 without its text
            incident = secrets.token_hex(8)
            log.exception("HTTP %s %s failed (incident %s)", method, path, incident)
            self._error(ApiError(500, f"internal error (incident {incident}, in the server log)",
                                 "server_error", None, "internal"))

    def _match(self, method: str, p: list[str]):
        routes = {("GET", 1, ""): self.playground, ("GET", 1, "health"): self.health,
                  ("GET", 1, "metrics"): self.metrics, ("GET", 2, "v1/models"): self.models,
                  ("POST", 3, "v1/images/generations"): self.images,
                  ("POST", 2, "v1/videos"): self.video_create, ("GET", 2, "v1/videos"): self.video_list}
        key = (method, len(p), "/".join(p))
        if key in routes:
            return routes[key]
        if p[:2] == ["v1", "videos"] and len(p) in (3, 4):
            if len(p) == 4 and p[3] in ("content", "events") and method == "GET":
                return self.video_content if p[3] == "content" else self.video_events
            if len(p) == 3:
                return {"GET": self.video_get, "DELETE": self.video_delete}.get(method)
        if p[:2] == ["v1", "images"] and len(p) == 3 and method == "GET":
            return self.image_content
        return None

    def do_GET(self):
        self._route("GET")

    def do_HEAD(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")

    def do_DELETE(self):
        self._route("DELETE")

    # ---- plain routes
    def playground(self, *_):
        self._send(200, PLAYGROUND.read_bytes(), "text/html; charset=utf-8")

    def health(self, *_):
        ok = self.api.serving()
        self._json(200 if ok else 503, {"status": "serving" if ok else "not_serving"})

    def metrics(self, *_):
        self._send(200, self.api.metrics.text().encode(), "text/plain; version=0.0.4")

    def models(self, *_):
        self._json(200, {"object": "list", "data": [self.api.model_card()]})

    # ---- admission, shared by images and videos
    def _submit(self, fields: dict, request_id: str, timeout, spelled: dict | None = None):
        """The admitted job; what admission cut of its prompt is logged and kept for the reply.
        `spelled`: field -> the body field it came from, where that is another one."""
        api = self.api
        try:
            checked, cuts = api.admission.admit(**fields, request_id=request_id)
        except DiffletError as err:
            api.metrics.rejected("invalid_argument")
            raise F.refusal(err, fields, api.info, spelled or {}) from None
        limits = [t for t in (timeout, api.request_timeout) if t]
        deadline = time.monotonic() + min(limits) if limits else None
        try:
            job = api.dispatcher.submit(checked, deadline)
        except Rejected as rej:
            api.metrics.rejected(rej.reason)
            raise from_rejected(rej) from None
        if cuts:
            log.warning("request %s: prompt truncated: %s", job.request_id,
                        "; ".join(cut.describe() for cut in cuts))
        self._cuts[job.request_id] = [{"field": c.field, "encoder": c.encoder, "tokens": c.tokens,
                                       "kept": c.limit, "dropped": c.dropped} for c in cuts]
        return job

    def _parse(self, parse, *args):
        """A body parser's result; its 400/404 counts as an invalid_argument reject, like gRPC's."""
        try:
            return parse(*args)
        except ApiError:
            self.api.metrics.rejected("invalid_argument")
            raise

    def _client_gone(self) -> bool:
        sock = self.connection
        if isinstance(sock, ssl.SSLSocket):  # no peeking under TLS: such a call runs to its answer
            return False
        if not select.select([sock], [], [], 0)[0]:
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _wait(self, job) -> None:
        """Until answered; expire at the deadline; cancel if the client went away."""
        while not job.done.wait(0.25):
            if job.deadline is not None and time.monotonic() >= job.deadline:
                self.api.dispatcher.expire(job)
            elif self._client_gone():
                self.api.dispatcher.cancel(job, "cancelled", "the client disconnected")

    # ---- images
    def images(self, *_):
        api = self.api
        if api.frames:
            raise ApiError(400, f"model: {api.model_id!r} is a video model; use POST /v1/videos",
                           param="model", code="wrong_route")
        body = self._body()
        timeout = self._parse(F.timeout, body)
        fields, opts = self._parse(F.image_request, body, api.info)
        if opts["stream"]:
            return self._images_stream(fields, opts, timeout)
        jobs = []  # n images, seeds seed, seed+1, ...: all queued at once, so they can batch
        try:
            for i in range(opts["n"]):
                jobs.append(self._submit({**fields, "seed": fields["seed"] + i}, api.new_id("img"), timeout))
            data = []
            for job in jobs:
                self._wait(job)
                if job.code != "ok":
                    raise from_job(job.code, job.message)
                data.append(self._image_item(job, opts))
        except BaseException:  # one image failed or was refused: the others are not wanted
            for job in jobs:
                api.dispatcher.cancel(job, "cancelled", "another image of the same request failed")
            raise
        self._json(200, {"created": int(time.time()), "data": data})

    def _image_item(self, job, opts) -> dict:
        image, fmt = self.api.encode_image(job.result["png"], opts["output_format"])
        item = {"revised_prompt": job.fields.prompt, "seed": job.result["seed"]}
        if self._cuts.get(job.request_id):  # as gRPC's `truncated`: one entry per encoder that cut
            item["truncated"] = self._cuts[job.request_id]
        if opts["response_format"] == "url":
            name = f"{job.request_id}.{fmt}"
            try:
                self.api.content.put(name, image)
            except ValueError as err:
                raise ApiError(507, str(err), "server_error", None, "content_too_large") from None
            scheme = "https" if self.api.tls else "http"
            item["url"] = f"{scheme}://{self.headers.get('Host') or self.api.address}/v1/images/{name}"
        else:
            item["b64_json"] = base64.b64encode(image).decode()
        return item

    def _images_stream(self, fields, opts, timeout) -> None:
        if opts["n"] != 1:
            raise bad_field("n", "stream: true serves one image per request")
        job = self._submit(fields, self.api.new_id("img"), timeout)
        self._begin_sse()
        try:
            for event in self.api.dispatcher.events(job):
                if event[0] == "progress":
                    self._sse({"type": "image_generation.progress", "step": event[1],
                               "total": event[2], "cached": event[3]})
            if job.code == "ok":
                self._sse({"type": "image_generation.completed", **self._image_item(job, opts)})
            else:
                self._sse({"type": "error", **from_job(job.code, job.message).body()})
        except (BrokenPipeError, ConnectionResetError):
            self.api.dispatcher.cancel(job, "cancelled", "the client disconnected")

    def _begin_sse(self) -> None:
        """A 200 Server-Sent Events reply that ends with the connection."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _sse(self, obj) -> None:
        self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
        self.wfile.flush()

    def image_content(self, _v1, _images, name):
        data = self.api.content.get(name) if "." in name and not name.endswith(".mp4") else None
        if data is None:
            raise ApiError(404, f"no image {name!r} (never made, or expired)", param="url", code="not_found")
        self._send(200, data, MIME.get(name.rsplit(".", 1)[1], "application/octet-stream"))
