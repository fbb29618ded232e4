"""The HTTP API's routes on FastAPI: the plain routes and images (videos: video_routes.py).

Invariants:
- Images mirror `DiffletServicer.Generate`: Admission.admit (the only check of the request's
  fields, refusals phrased by fields.refusal) -> Dispatcher.submit -> wait until answered or
  the deadline (then Dispatcher.expire) -> reply; a client that disconnects while it waits
  cancels its job. `stream: true` answers Server-Sent Events: one per step, then the image.
- Refusals are counted in the shared metrics exactly as the gRPC servicer counts them.
- A truncated prompt is logged as gRPC logs it, and each image item carries `truncated` (field,
  encoder, tokens, kept, dropped), the gRPC reply's list.
- Request bodies are read and checked by fields.py (one set of messages for JSON and forms);
  openapi.py declares the same bodies, derived from the request schema, for /openapi.json.
"""
from __future__ import annotations

import base64
import time
from pathlib import Path

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from difflet.runtime.http import fields as F
from difflet.runtime.http import openapi
from difflet.runtime.http.content import owned
from difflet.runtime.http.errors import ApiError, bad_field, from_job
from difflet.runtime.http.plumbing import (SSE_HEADERS, KeyCheck, endpoint, error_response, get, in_thread,
                                           job_events, owner, parse, read_body, sse_line, submit,
                                           wait_jobs)
from difflet.runtime.http.video_routes import add_video_routes
from difflet.version import __version__

PLAYGROUND = Path(__file__).with_name("playground.html")
MIME = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp", "mp4": "video/mp4"}


def build_app(api) -> FastAPI:
    """The ASGI app of one HttpApi (`api`: the server's admission, dispatcher, stores)."""
    app = FastAPI(title="Difflet", version=__version__, redoc_url=None,
                  description="OpenAI-compatible image and video generation (docs/serving.md)")
    app.add_middleware(KeyCheck, api=api)

    @app.exception_handler(HTTPException)
    async def _no_route(request: Request, exc: HTTPException):
        return error_response(ApiError(exc.status_code if exc.status_code == 405 else 404,
                                       f"no route {request.method} {request.url.path}", code="not_found"))

    @get(app, "/", include_in_schema=False)
    @endpoint
    async def playground(request: Request):
        return Response(PLAYGROUND.read_bytes(), media_type="text/html; charset=utf-8")

    @get(app, "/health", summary="Liveness and readiness (no key needed)")
    @endpoint
    async def health(request: Request):
        ok = api.serving()
        return JSONResponse({"status": "serving" if ok else "not_serving"}, 200 if ok else 503)

    @get(app, "/metrics", summary="Prometheus metrics")
    @endpoint
    async def metrics(request: Request):
        return Response(api.metrics.text(), media_type="text/plain; version=0.0.4")

    @get(app, "/v1/models", summary="The served model's card")
    @endpoint
    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [api.model_card()]})

    @app.post("/v1/images/generations", summary="Generate images (OpenAI images.generate)",
              openapi_extra=openapi.body(api, "image"))
    @endpoint
    async def images(request: Request):
        return await Images(api, request).run()

    @app.post("/v1/images/edits", summary="Edit images: image-to-image, inpainting (OpenAI images.edit)",
              openapi_extra=openapi.body(api, "edit"))
    @endpoint
    async def edits(request: Request):
        return await Images(api, request, edit=True).run()

    @get(app, "/v1/images/{name}", summary="An image of a url reply")
    @endpoint
    async def image_content(request: Request, name: str):
        # stored under its owner's tag: another key's holder asks for another file (404)
        data = api.content.get(owned(owner(request), name)) if "." in name and not name.endswith(".mp4") else None
        if data is None:
            raise ApiError(404, f"no image {name!r} (never made, or expired)", param="url", code="not_found")
        return Response(data, media_type=MIME.get(name.rsplit(".", 1)[1], "application/octet-stream"))

    add_video_routes(app, api)
    return app


class Images:
    """One POST /v1/images/generations, or /v1/images/edits (`edit`: a form with image files)."""

    def __init__(self, api, request: Request, edit: bool = False) -> None:
        self.api, self.request, self.cuts, self.edit = api, request, {}, edit

    async def run(self):
        api = self.api
        if api.frames:
            raise ApiError(400, f"model: {api.model_id!r} is a video model; use POST /v1/videos",
                           param="model", code="wrong_route")
        if self.edit:  # images in the body: the bound is the admission's, sized for its images
            body = await read_body(self.request, api.admission.max_message, F.EDIT_FILES)
        else:
            body = await read_body(self.request)
        timeout = parse(api, F.timeout, body)
        fields, opts = parse(api, F.edit_request if self.edit else F.image_request, body, api.info)
        if opts["stream"]:
            if opts["n"] != 1:
                raise bad_field("n", "stream: true serves one image per request")
            job = await self._submit(fields, timeout)
            return StreamingResponse(self._stream(job, opts), media_type="text/event-stream",
                                     headers=SSE_HEADERS)
        jobs = []  # n images, seeds seed, seed+1, ...: all queued at once, so they can batch
        try:
            for i in range(opts["n"]):
                jobs.append(await self._submit({**fields, "seed": fields["seed"] + i}, timeout))
            await wait_jobs(self.request, api.dispatcher, jobs)
            data = []
            for job in jobs:
                if job.code != "ok":
                    raise from_job(job.code, job.message)
                data.append(await self._item(job, opts))
        except BaseException:  # one image failed or was refused: the others are not wanted
            for job in jobs:
                api.dispatcher.cancel(job, "cancelled", "another image of the same request failed")
            raise
        return JSONResponse({"created": int(time.time()), "data": data})

    async def _submit(self, fields, timeout):
        job, cuts = await submit(self.api, self.request, fields, self.api.new_id("img"), timeout,
                                 F.EDIT_SPELLED if self.edit else None)
        self.cuts[job.request_id] = cuts
        return job

    async def _item(self, job, opts) -> dict:
        api = self.api
        image, fmt = await in_thread(api.encode_image, job.result["png"], opts["output_format"])
        item = {"revised_prompt": job.fields.prompt, "seed": job.result["seed"]}
        if self.cuts.get(job.request_id):  # as gRPC's `truncated`: one entry per encoder that cut
            item["truncated"] = self.cuts[job.request_id]
        if opts["response_format"] == "url":
            name = f"{job.request_id}.{fmt}"
            try:
                await in_thread(api.content.put, owned(job.owner, name), image)
            except ValueError as err:
                raise ApiError(507, str(err), "server_error", None, "content_too_large") from None
            scheme = "https" if api.tls else "http"
            host = self.request.headers.get("host") or api.address
            item["url"] = f"{scheme}://{host}/v1/images/{name}"
        else:
            item["b64_json"] = base64.b64encode(image).decode()
        return item

    async def _stream(self, job, opts):
        try:
            async for event in job_events(self.api.dispatcher, job):
                if event[0] == "progress":
                    yield sse_line({"type": "image_generation.progress", "step": event[1],
                                    "total": event[2], "cached": event[3]})
            if job.code == "ok":
                yield sse_line({"type": "image_generation.completed", **await self._item(job, opts)})
            else:
                yield sse_line({"type": "error", **from_job(job.code, job.message).body()})
        except ApiError as err:
            yield sse_line({"type": "error", **err.body()})
        finally:  # the client went away mid-stream (the generator was cancelled)
            self.api.dispatcher.cancel(job, "cancelled", "the client disconnected")
