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
- `changed` is notified, and each of `watchers` called (lock held; must not block), on every
  record change: what the SSE route waits on.
- With a state dir (the content store's `state`, jobstore.py) every record is saved: at
  admission, at dispatch (before the Run reaches a model process: `Job.on_started`), at each
  progress change and at its end. A new process on the same dir (`_restore`, then `resume`)
  serves the ended records, fails the job that was in a model process when the old process
  died (error code "interrupted": a job is never run twice) and submits the queued ones again,
  same id and request, in admission order, once a model process is ready.
"""
from __future__ import annotations

import json
import secrets
import threading
import time
from typing import Any

import msgspec

from difflet.runtime.http.content import ContentStore
from difflet.runtime.http.errors import ApiError
from difflet.runtime.http.recovery import INTERRUPTED, Refused, submit_again

ENDED = ("completed", "failed")


class VideoJob:
    def __init__(self, job, model: str, size: str, frames: int, fps: float, *, video_id: str = "",
                 created_at: int = 0, shown: dict | None = None, owner: str = "") -> None:
        """`job`: the dispatcher Job, or None for a restored queued job not yet submitted again
        (`shown`: its saved request's seed and steps). `owner`: the job's API key tag."""
        self.id = video_id or "video_" + secrets.token_hex(16)  # 128 bits: the id is the handle
        self.job, self.model, self.size, self.frames, self.fps = job, model, size, frames, fps
        self.owner = job.owner if job is not None else owner
        fields = job.fields if job is not None else None
        self.seed = fields.seed if fields is not None else (shown or {}).get("seed")
        self.steps = fields.steps if fields is not None else (shown or {}).get("steps")
        self.created_at = created_at or int(time.time())
        self.completed_at: int | None = None
        self.status, self.progress, self.error = "queued", 0, None
        self.version = 0
        self.expires: float | None = None  # monotonic time the record is dropped (once ended)
        self.saved: dict[str, Any] = {}  # a restored record's row (its request, its deadline)

    def to_json(self) -> dict[str, Any]:
        status = self.status
        if status == "queued" and self.job is not None and self.job.dispatched is not None:
            status = "in_progress"
        return {"id": self.id, "object": "video", "model": self.model, "status": status,
                "progress": self.progress, "created_at": self.created_at,
                "completed_at": self.completed_at, "size": self.size,
                "seconds": f"{self.frames / self.fps:g}", "num_frames": self.frames, "fps": self.fps,
                "seed": self.seed, "num_inference_steps": self.steps, "error": self.error}


class VideoJobs:
    MAX_RECORDS = 10000  # ended records kept at most (oldest dropped first), beyond retention

    def __init__(self, dispatcher, content: ContentStore, retention_s: float, admission=None,
                 model: str = "") -> None:
        """`admission` and `model` (the served model's id) check a restored job again before it
        is resubmitted: another model, or a request this server no longer accepts, fails it."""
        self.dispatcher, self.store, self.retention_s = dispatcher, content, retention_s
        self.admission, self.model = admission, model
        self.db = getattr(content, "state", None)
        self._jobs: dict[str, VideoJob] = {}
        self._pending: list[VideoJob] = []  # restored queued jobs, for `resume`
        self.changed = threading.Condition()
        self.watchers: set = set()
        content.on_evict = self._evicted
        if self.db is not None:
            self._restore()

    def add(self, job, model: str, size: str, frames: int, fps: float) -> VideoJob:
        video = VideoJob(job, model, size, frames, fps)
        with self.changed:
            self._jobs[video.id] = video
            if self.db is not None:
                deadline = None if job.deadline is None else time.time() + job.deadline - time.monotonic()
                self.db.add_video(id=video.id, request=msgspec.json.encode(job.fields).decode(), model=model,
                                  size=size, frames=frames, fps=fps, status="queued", progress=0,
                                  created_at=video.created_at, deadline=deadline, owner=video.owner)
                self._on_dispatch(video, job)
        self._start_watch(video)
        return video

    def get(self, video_id: str, owner: str) -> VideoJob:
        """The job, if `owner` made it (another key's job is as absent as a missing one)."""
        with self.changed:
            self._expire_records()
            video = self._jobs.get(video_id)
        if video is None or video.owner != owner:
            raise ApiError(404, f"no video job {video_id!r} (never made, deleted, or expired "
                                f"after its retention)", "invalid_request_error", "video_id", "not_found")
        return video

    def list(self, owner: str) -> list[VideoJob]:
        """`owner`'s jobs, newest first."""
        with self.changed:
            self._expire_records()
            mine = [v for v in self._jobs.values() if v.owner == owner]
        return sorted(mine, key=lambda v: v.created_at, reverse=True)

    def content(self, video_id: str, owner: str) -> bytes:
        video = self.get(video_id, owner)
        data = self.store.get(video.id + ".mp4") if video.status == "completed" else None
        if data is None:
            raise ApiError(404, f"video job {video_id!r} has no content (status {video.to_json()['status']})",
                           "invalid_request_error", "video_id", "not_ready")
        return data

    def delete(self, video_id: str, owner: str) -> dict[str, Any]:
        """Cancel (queued: leaves the queue; running: stops at its next step boundary) and forget."""
        video = self.get(video_id, owner)
        message = f"cancelled by DELETE /v1/videos/{video_id}"
        if video.job is not None:
            state = self.dispatcher.cancel(video.job, "cancelled", message)
        else:  # restored and not yet submitted again: forgetting it is leaving the queue
            state = "queued" if video.status == "queued" else ""
        with self.changed:
            self._forget([video.id])
            self._notify()
        self.store.remove(video.id + ".mp4")
        return {"id": video.id, "object": "video.deleted", "deleted": True, "cancelled": state or None}

    def snapshot(self, video: VideoJob) -> tuple[int, str, dict[str, Any]]:
        """(version, status, the job object), read under the lock: one consistent view."""
        with self.changed:
            return video.version, video.status, video.to_json()

    def _notify(self) -> None:  # lock held
        self.changed.notify_all()
        for watcher in list(self.watchers):
            watcher()

    def resume(self) -> None:
        """Submit the restored queued jobs again (a thread: they wait for a ready model process)."""
        if self._pending:
            threading.Thread(target=self._resubmit, name="video-resume", daemon=True).start()

    # ---- the watcher
    def _start_watch(self, video: VideoJob) -> None:
        threading.Thread(target=self._watch, args=(video,), name=f"watch-{video.id}", daemon=True).start()

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
            saved = {k: v for k, v in changes.items() if getattr(video, k) != v and k != "expires"}
            for key, value in changes.items():
                setattr(video, key, value)
            video.version += 1
            if saved and self.db is not None and self._jobs.get(video.id) is video:
                if "error" in saved:
                    saved["error"] = None if saved["error"] is None else json.dumps(saved["error"])
                if video.expires is not None and "status" in saved:  # ended: its wall-clock expiry
                    saved["expires"] = time.time() + video.expires - time.monotonic()
                self.db.set_video(video.id, **saved)
            self._notify()

    def _end(self, video: VideoJob, status: str, error) -> None:
        with self.changed:  # one change: the record ends and the record bound is applied at once
            self._update(video, status=status, error=error, completed_at=int(time.time()),
                         progress=100 if status == "completed" else video.progress,
                         expires=time.monotonic() + self.retention_s)
            self._expire_records()  # so the bound holds in memory, not only when the jobs are read

    def _evicted(self, name: str) -> None:
        with self.changed:
            self._forget([name.removesuffix(".mp4")])
            self._notify()

    def _expire_records(self) -> None:  # lock held
        now = time.monotonic()
        ended = [v for v in self._jobs.values() if v.expires is not None]
        gone = [v.id for v in ended if v.expires <= now]
        kept = sorted((v for v in ended if v.expires > now), key=lambda v: v.expires)
        self._forget(gone + [v.id for v in kept[:max(0, len(kept) - self.MAX_RECORDS)]])

    def _forget(self, ids: list[str]) -> None:  # lock held
        for video_id in ids:
            self._jobs.pop(video_id, None)
        if self.db is not None:
            self.db.drop_videos(ids)

    # ---- the state dir: dispatch records, restore, resubmit
    def _on_dispatch(self, video: VideoJob, job) -> None:  # lock held, the row saved
        """Record `job`'s dispatch (from Job.started) as in_progress; the hook goes first, then
        `dispatched` is read, so a dispatch is recorded either here or by the hook."""
        def started(_job) -> None:
            with self.changed:  # after add's insert; never over an ended or forgotten record
                if self._jobs.get(video.id) is video and video.status not in ENDED:
                    self.db.set_video(video.id, status="in_progress")

        job.on_started.append(started)
        if job.dispatched is not None:
            self.db.set_video(video.id, status="in_progress")

    def _restore(self) -> None:
        """Load the state dir's records (before any thread runs): see the invariants."""
        now, mono = time.time(), time.monotonic()
        stale = []
        for row in self.db.videos():
            try:
                shown = msgspec.json.decode(row["request"])
            except msgspec.DecodeError:
                shown = {}
            video = VideoJob(None, row["model"], row["size"], row["frames"], row["fps"], video_id=row["id"],
                             created_at=row["created_at"], shown=shown if isinstance(shown, dict) else {},
                             owner=row["owner"])
            video.saved, video.progress, video.completed_at = row, row["progress"], row["completed_at"]
            video.error = json.loads(row["error"]) if row["error"] else None
            if row["status"] in ENDED:
                if row["expires"] is None or row["expires"] <= now or (
                        row["status"] == "completed" and not self.store.has(video.id + ".mp4")):
                    stale.append(video.id)
                    continue
                video.status, video.expires = row["status"], mono + min(row["expires"] - now, self.retention_s)
            elif row["status"] == "in_progress":  # it was in a model process: never run twice
                video.status, video.error, video.completed_at = "failed", dict(INTERRUPTED), int(now)
                video.expires = mono + self.retention_s
                self.db.set_video(video.id, status="failed", error=json.dumps(INTERRUPTED),
                                  completed_at=int(now), expires=now + self.retention_s)
            else:
                self._pending.append(video)
            self._jobs[video.id] = video
        self.db.drop_videos(stale)
        kept = {v.id + ".mp4" for v in self._jobs.values() if v.status == "completed"}
        for name in self.store.names():  # an MP4 whose record is gone (deleted, dropped)
            if name.endswith(".mp4") and name not in kept:
                self.store.remove(name)
        self._expire_records()

    def _resubmit(self) -> None:
        replicas = self.dispatcher.replicas
        for replica in replicas:
            replica.started.wait()
        if not any(r.state in ("ready", "busy") for r in replicas):
            return  # the server failed to start and exits: the jobs stay queued for the next start
        pending, self._pending = self._pending, []
        for video in pending:
            with self.changed:
                if self._jobs.get(video.id) is not video:
                    continue  # deleted while the model loaded
            try:
                job = submit_again(self.dispatcher, self.admission, self.model, video)
            except Refused as refused:
                self._end(video, "failed", {"code": refused.code, "message": refused.message})
                continue
            with self.changed:
                kept = self._jobs.get(video.id) is video
                if kept:
                    video.job = job
                    self._on_dispatch(video, job)
            if not kept:  # deleted while it was being submitted
                self.dispatcher.cancel(job, "cancelled", f"cancelled by DELETE /v1/videos/{video.id}")
                continue
            self._start_watch(video)
