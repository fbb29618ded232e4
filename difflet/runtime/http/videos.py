"""Asynchronous video jobs of the HTTP API (`/v1/videos`), each one dispatcher `Job`.

Invariants:
- A video job is a Job submitted to the shared Dispatcher (same queue, replicas, metrics as
  gRPC); a watcher thread per job reads its events (like GenerateStream) and answers the
  deadline at the deadline (`Dispatcher.expire`).
- status: queued -> in_progress (dispatched to a model process) -> completed | failed;
  `progress` (0-100) rises with the per-step events and is 100 only when completed. A job
  whose model process dies is failed (error code "unavailable", the dispatcher's message);
  it is never retried behind the client's back. Every accepted job ends completed or failed (a
  full disk fails it as `storage_error`); its MP4 bytes live in the content store only.
- Records and their MP4 are kept `retention_s` after the job ended, and the MP4s together
  within the content store's byte bound; then the record is deleted (GET answers 404).
- `changed` is notified on every record change (what the SSE route waits on).
"""
from __future__ import annotations

import secrets
import threading
import time
from typing import Any

from difflet.runtime.http.content import ContentStore
from difflet.runtime.http.errors import ApiError


class VideoJob:
    def __init__(self, job, model: str, size: str, frames: int, fps: float) -> None:
        self.id = "video_" + secrets.token_hex(12)
        self.job, self.model, self.size, self.frames, self.fps = job, model, size, frames, fps
        self.created_at = int(time.time())
        self.completed_at: int | None = None
        self.status, self.progress, self.error = "queued", 0, None
        self.version = 0
        self.expires: float | None = None  # monotonic time the record is dropped (once ended)

    def to_json(self) -> dict[str, Any]:
        status = self.status
        if status == "queued" and self.job.dispatched is not None:
            status = "in_progress"
        return {"id": self.id, "object": "video", "model": self.model, "status": status,
                "progress": self.progress, "created_at": self.created_at,
                "completed_at": self.completed_at, "size": self.size,
                "seconds": f"{self.frames / self.fps:g}", "num_frames": self.frames, "fps": self.fps,
                "seed": self.job.fields.seed, "num_inference_steps": self.job.fields.steps,
                "error": self.error}


class VideoJobs:
    MAX_RECORDS = 10000  # ended records kept at most (oldest dropped first), beyond retention

    def __init__(self, dispatcher, content: ContentStore, retention_s: float) -> None:
        self.dispatcher, self.store, self.retention_s = dispatcher, content, retention_s
        self._jobs: dict[str, VideoJob] = {}
        self.changed = threading.Condition()
        content.on_evict = self._evicted

    def add(self, job, model: str, size: str, frames: int, fps: float) -> VideoJob:
        video = VideoJob(job, model, size, frames, fps)
        with self.changed:
            self._jobs[video.id] = video
        threading.Thread(target=self._watch, args=(video,), name=f"watch-{video.id}", daemon=True).start()
        return video

    def get(self, video_id: str) -> VideoJob:
        with self.changed:
            self._expire_records()
            video = self._jobs.get(video_id)
        if video is None:
            raise ApiError(404, f"no video job {video_id!r} (never made, deleted, or expired "
                                f"after its retention)", "invalid_request_error", "video_id", "not_found")
        return video

    def list(self) -> list[VideoJob]:
        with self.changed:
            self._expire_records()
            return sorted(self._jobs.values(), key=lambda v: v.created_at, reverse=True)

    def content(self, video_id: str) -> bytes:
        video = self.get(video_id)
        data = self.store.get(video.id + ".mp4") if video.status == "completed" else None
        if data is None:
            raise ApiError(404, f"video job {video_id!r} has no content (status {video.to_json()['status']})",
                           "invalid_request_error", "video_id", "not_ready")
        return data

    def delete(self, video_id: str) -> dict[str, Any]:
        """Cancel (queued: leaves the queue; running: stops at its next step boundary) and forget."""
        video = self.get(video_id)
        state = self.dispatcher.cancel(video.job, "cancelled", f"cancelled by DELETE /v1/videos/{video_id}")
        with self.changed:
            self._jobs.pop(video.id, None)
            self.changed.notify_all()
        self.store.remove(video.id + ".mp4")
        return {"id": video.id, "object": "video.deleted", "deleted": True, "cancelled": state or None}

    def wait_change(self, video: VideoJob, version: int, timeout: float) -> bool:
        """True once `video` changed past `version` (or was deleted); False after `timeout`."""
        with self.changed:
            return self.changed.wait_for(
                lambda: video.version != version or self._jobs.get(video.id) is not video, timeout)

    # ---- the watcher
    def _watch(self, video: VideoJob) -> None:
        job = video.job
        for event in self.dispatcher.events(job):
            if event[0] == "progress":
                _, step, total, _, _ = event
                self._update(video, status="in_progress", progress=min(99, step * 100 // max(1, total)))
        if job.code == "ok":
            mp4, job.result["mp4"] = job.result["mp4"], b""  # the store holds it from here, or no one
            try:
                self.store.put(video.id + ".mp4", mp4)
            except ValueError as err:
                self._end(video, "failed", {"code": "content_too_large", "message": str(err)})
                return
            except OSError as err:  # the disk is full or failing: a failed job, never a stuck one
                self._end(video, "failed", {"code": "storage_error", "message":
                                            f"the video could not be stored ({err.strerror or err})"})
                return
            self._end(video, "completed", None)
        else:
            self._end(video, "failed", {"code": job.code, "message": job.message})

    def _update(self, video: VideoJob, **changes) -> None:
        with self.changed:
            for key, value in changes.items():
                setattr(video, key, value)
            video.version += 1
            self.changed.notify_all()

    def _end(self, video: VideoJob, status: str, error) -> None:
        with self.changed:  # one change: the record ends and the record bound is applied at once
            self._update(video, status=status, error=error, completed_at=int(time.time()),
                         progress=100 if status == "completed" else video.progress,
                         expires=time.monotonic() + self.retention_s)
            self._expire_records()  # so the bound holds in memory, not only when the jobs are read

    def _evicted(self, name: str) -> None:
        with self.changed:
            self._jobs.pop(name.removesuffix(".mp4"), None)
            self.changed.notify_all()

    def _expire_records(self) -> None:  # lock held
        now = time.monotonic()
        ended = [v for v in self._jobs.values() if v.expires is not None]
        for v in ended:
            if v.expires <= now:
                self._jobs.pop(v.id)
        for v in sorted(ended, key=lambda v: v.expires)[:max(0, len(ended) - self.MAX_RECORDS)]:
            self._jobs.pop(v.id, None)
