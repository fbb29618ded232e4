"""The `/v1/videos` routes, mixed into the HTTP `Handler` (which provides `api`, `_body`,
`_parse`, `_submit`, `_json`, `_send`, `_sse`).

Invariant: a video job is admitted exactly like an image request (same Admission, same
Dispatcher queue); the job store (`videos.py`) owns its life after admission.
"""
from __future__ import annotations

from difflet.runtime.http import fields as F
from difflet.runtime.http.errors import ApiError

MP4 = "video/mp4"


class VideoRoutes:
    def video_create(self, *_):
        api = self.api
        if not api.frames:
            raise ApiError(400, f"model: {api.model_id!r} is an image model; use POST "
                                f"/v1/images/generations", param="model", code="wrong_route")
        body = self._body()
        timeout = self._parse(F.timeout, body)
        fields, spelled = self._parse(F.video_request, body, api.info, api.fps)
        job = self._submit(fields, api.new_id("video"), timeout, spelled)
        video = api.videos.add(job, api.model_id, f"{job.fields.width}x{job.fields.height}",
                               job.fields.frames, api.fps)
        self._json(200, video.to_json())

    def video_list(self, *_):
        self._json(200, {"object": "list", "data": [v.to_json() for v in self.api.videos.list()]})

    def video_get(self, _v1, _videos, video_id):
        self._json(200, self.api.videos.get(video_id).to_json())

    def video_content(self, _v1, _videos, video_id, _content):
        self._send(200, self.api.videos.content(video_id), MP4)

    def video_delete(self, _v1, _videos, video_id):
        self._json(200, self.api.videos.delete(video_id))

    def video_events(self, _v1, _videos, video_id, _events):
        """Server-Sent Events: the job object at every change, until completed/failed/deleted."""
        videos = self.api.videos
        video = videos.get(video_id)
        self._begin_sse()
        version = -1
        while True:
            seen = video.version
            if seen != version:
                self._sse(video.to_json())
                version = seen
            if video.status in ("completed", "failed"):
                return
            try:
                videos.get(video_id)
            except ApiError as err:  # deleted meanwhile
                self._sse(err.body())
                return
            videos.wait_change(video, version, 15.0)  # a keep-alive line at least every 15 s
            if video.version == version:
                self.wfile.write(b": keep-alive\n\n")
                self.wfile.flush()
