"""The `/v1/videos` routes (OpenAI's videos API).

Invariant: a video job is admitted exactly like an image request (routes.submit: same
Admission, same Dispatcher queue); the job store (`videos.py`) owns its life after admission.
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from difflet.runtime.http import fields as F
from difflet.runtime.http import openapi
from difflet.runtime.http.errors import ApiError
from difflet.runtime.http.plumbing import (MAX_BODY, SSE_HEADERS, Wake, endpoint, get, in_thread, owner,
                                           parse, read_body, sse_line, submit)
from difflet.runtime.image_fields import profile_images

KEEP_ALIVE_S = 15.0  # an SSE comment at least this often, so proxies keep the stream open


def add_video_routes(app, api) -> None:
    @app.post("/v1/videos", summary="Create a video job (OpenAI videos.create)",
              openapi_extra=openapi.body(api, "video"))
    @endpoint
    async def video_create(request: Request):
        if not api.frames:
            raise ApiError(400, f"model: {api.model_id!r} is an image model; use POST "
                                f"/v1/images/generations", param="model", code="wrong_route")
        # an image-to-video body carries its image: the admission's bound, 4/3 for a base64 data URL
        limit = 4 * api.admission.max_message // 3 if profile_images(api.info.profile)[0] else MAX_BODY
        body = await read_body(request, limit, F.VIDEO_FILES)
        timeout = parse(api, F.timeout, body)
        fields, spelled = parse(api, F.video_request, body, api.info, api.fps)
        job, _ = await submit(api, request, fields, api.new_id("video"), timeout, spelled)
        video = api.videos.add(job, api.model_id, f"{job.fields.width}x{job.fields.height}",
                               job.fields.frames, api.fps)  # owned by job.owner
        return JSONResponse(video.to_json())

    @get(app, "/v1/videos", summary="The video jobs")
    @endpoint
    async def video_list(request: Request):
        return JSONResponse({"object": "list", "data": [v.to_json() for v in api.videos.list(owner(request))]})

    @get(app, "/v1/videos/{video_id}", summary="One video job")
    @endpoint
    async def video_get(request: Request, video_id: str):
        return JSONResponse(api.videos.get(video_id, owner(request)).to_json())

    @get(app, "/v1/videos/{video_id}/content", summary="A job's MP4")
    @endpoint
    async def video_content(request: Request, video_id: str):
        return Response(await in_thread(api.videos.content, video_id, owner(request)), media_type="video/mp4")

    @app.delete("/v1/videos/{video_id}", summary="Cancel and forget a video job")
    @endpoint
    async def video_delete(request: Request, video_id: str):
        return JSONResponse(api.videos.delete(video_id, owner(request)))

    @app.get("/v1/videos/{video_id}/events", summary="A job's changes as Server-Sent Events")
    @endpoint
    async def video_events(request: Request, video_id: str):
        video = api.videos.get(video_id, owner(request))  # 404 before the stream starts
        return StreamingResponse(_events(api.videos, video), media_type="text/event-stream",
                                 headers=SSE_HEADERS)


async def _events(videos, video):
    """The job object at every change, until completed/failed/deleted; keep-alives meanwhile."""
    wake, version = Wake(), -1
    videos.watchers.add(wake)
    try:
        while True:
            wake.arm()
            seen, status, record = videos.snapshot(video)
            if seen != version:
                version = seen
                yield sse_line(record)
            if status in ("completed", "failed"):
                return
            try:
                videos.get(video.id, video.owner)
            except ApiError as err:  # deleted meanwhile
                yield sse_line(err.body())
                return
            await wake.wait(KEEP_ALIVE_S)
            if not wake.flag.is_set():
                yield b": keep-alive\n\n"
    finally:
        videos.watchers.discard(wake)
