"""Video jobs that survive the API process (issue 31 item 3 and finding 10): the state dir's job
store (difflet/runtime/http/jobstore.py), the content store's index, and recovery in VideoJobs.

Oracles: the documented recovery (docs/serving.md "What survives a restart"): after a `kill -9`
and a restart on the same --state-dir, every job that was accepted ends in exactly one of
completed (before the kill, or run once after it when it was queued) or failed (as before the
kill, or `interrupted` when it was in a model process), each listed once; the model process of
the killed server died with it; no content directory is left in the server's TMPDIR. The unit
tests play the killed process in a child that SIGKILLs itself after saving its jobs, so the
state dir is exactly what a kill leaves (no close, the lock dropped by the kernel).
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from difflet.errors import DiffletError
from difflet.runtime.http.content import ContentStore
from difflet.runtime.http.errors import ApiError
from difflet.runtime.http.jobstore import JobStore
from difflet.runtime.http.videos import VideoJobs
from difflet.runtime.jobs import Job
from difflet.runtime.request import Request

WAIT_S = 300.0


class FakeDispatcher:
    """The Dispatcher's face VideoJobs uses: events end with the job's answer; `submit` records
    the requests resubmitted (its replica is ready once `ready` is set)."""

    def __init__(self) -> None:
        self.replicas = [SimpleNamespace(started=threading.Event(), state="ready")]
        self.submitted: list[tuple[Request, float | None]] = []
        self.jobs: list[Job] = []
        self.changed = threading.Condition()

    def events(self, job):
        while (event := job.events.get())[0] != "end":
            yield event

    def cancel(self, job, code, message):
        return "queued" if job.finish(code, message) else ""

    def submit(self, request, deadline, owner=""):
        job = Job(request, deadline, owner)
        with self.changed:
            self.submitted.append((request, deadline))
            self.jobs.append(job)
            self.changed.notify_all()
        return job

    def wait_submitted(self, n: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.submitted) >= n, WAIT_S), self.submitted


def ended(jobs: VideoJobs, video) -> dict:
    """The record once ended (waits on the store's change notifications)."""
    with jobs.changed:
        assert jobs.changed.wait_for(lambda: video.status in ("completed", "failed"), WAIT_S), video.to_json()
    return video.to_json()


def request(seed: int, **kw) -> Request:
    return Request(prompt="a red fox", seed=seed, steps=4, height=32, width=32, frames=9,
                   request_id=f"video-{seed}", **kw)


# The killed process: jobs in every state, saved, then SIGKILL (no close, no atexit).
_KILLED = r"""
import json, os, signal, sys, time
sys.path.insert(0, sys.argv[2])
from types import SimpleNamespace
from test_http_jobstore import FakeDispatcher, ended, request
from difflet.runtime.http.content import ContentStore
from difflet.runtime.http.videos import VideoJobs
from difflet.runtime.jobs import Job

store = ContentStore(3600, 1 << 20, state_dir=sys.argv[1])
jobs = VideoJobs(FakeDispatcher(), store, 3600, model="wan21_tiny")
made = {}
for name, seed in (("done", 1), ("old", 2), ("failed", 3), ("running", 4), ("queued1", 5),
                   ("queued2", 6), ("late", 7), ("deleted", 8), ("cancelled", 9), ("sent", 10)):
    deadline = time.monotonic() + 3600 if name in ("queued2", "late") else None
    made[name] = jobs.add(Job(request(seed), deadline), "wan21_tiny", "32x32", 9, 16.0)
for name in ("done", "old"):
    made[name].job.finish("ok", "", {"mp4": f"mp4 of {name}".encode()})
made["failed"].job.finish("internal", "RuntimeError: boom")
made["running"].job.started(SimpleNamespace(index=0, pid=1))   # sent to a model process
made["running"].job.progress(1, 4, False, 1)
made["sent"].job.started(SimpleNamespace(index=0, pid=1))   # sent, killed before its first step
jobs.delete(made["deleted"].id, "")
cancelled = made["cancelled"].job
cancelled.finish("cancelled", "cancelled by a Cancel call")  # answered while queued ...
for name in ("done", "old", "failed", "cancelled"):
    ended(jobs, made[name])
cancelled.started(SimpleNamespace(index=0, pid=1))   # ... then sent: the record stays failed
with jobs.changed:
    assert jobs.changed.wait_for(lambda: made["running"].progress == 25, 60)
print(json.dumps({name: video.id for name, video in made.items()}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def killed_process_state(state: Path) -> dict[str, str]:
    """Run _KILLED on `state`; {name: video id}."""
    out = subprocess.run([sys.executable, "-c", _KILLED, str(state), str(Path(__file__).parent)],
                         capture_output=True, text=True, timeout=WAIT_S)
    assert out.returncode == -signal.SIGKILL, out.stderr
    return json.loads(out.stdout)


def test_recovery_after_kill_serves_ended_fails_the_running_and_resubmits_the_queued(tmp_path):
    ids = killed_process_state(tmp_path)
    db = sqlite3.connect(tmp_path / "jobs.sqlite3")  # what the next start meets: an expired record, a deadline passed
    with db:
        db.execute("UPDATE videos SET expires = 1 WHERE id = ?", (ids["old"],))
        db.execute("UPDATE videos SET deadline = 1 WHERE id = ?", (ids["late"],))
    db.close()
    (tmp_path / "content" / "video_stray.mp4").write_bytes(b"no record")  # a write never indexed
    dispatcher = FakeDispatcher()
    store = ContentStore(3600, 1 << 20, state_dir=str(tmp_path))
    try:
        jobs = VideoJobs(dispatcher, store, 3600, model="wan21_tiny")
        record = {name: jobs.get(ids[name], "").to_json() for name in ids if name not in ("old", "deleted")}
        for gone in ("old", "deleted"):
            with pytest.raises(ApiError) as err:
                jobs.get(ids[gone], "")
            assert err.value.status == 404
        assert record["done"]["status"] == "completed" and jobs.content(ids["done"], "") == b"mp4 of done"
        assert (record["failed"]["status"], record["failed"]["error"]["code"]) == ("failed", "internal")
        assert (record["cancelled"]["status"], record["cancelled"]["error"]["code"]) == ("failed", "cancelled")
        for name in ("running", "sent"):  # in a model process when it died: never run twice
            assert (record[name]["status"], record[name]["error"]["code"]) == ("failed", "interrupted")
            assert "not run again" in record[name]["error"]["message"]
        assert [record[n]["status"] for n in ("queued1", "queued2", "late")] == ["queued"] * 3
        assert sorted(p.name for p in (tmp_path / "content").iterdir()) == [ids["done"] + ".mp4"]

        jobs.resume()
        assert dispatcher.submitted == []  # nothing before a model process is ready
        dispatcher.replicas[0].started.set()
        dispatcher.wait_submitted(2)
        assert [r for r, _ in dispatcher.submitted] == [request(5), request(6)]  # same requests, in order
        assert dispatcher.submitted[0][1] is None and dispatcher.submitted[1][1] is not None
        late = ended(jobs, jobs.get(ids["late"], ""))
        assert (late["status"], late["error"]["code"]) == ("failed", "deadline")
        for job, name in zip(dispatcher.jobs, ("queued1", "queued2")):
            job.finish("ok", "", {"mp4": name.encode()})
            assert ended(jobs, jobs.get(ids[name], ""))["status"] == "completed"
            assert jobs.content(ids[name], "") == name.encode()
        assert len(dispatcher.submitted) == 2  # the running, sent and late ones never again
        listed = [v.id for v in jobs.list("")]
        assert sorted(listed) == sorted(ids[n] for n in ids if n not in ("old", "deleted"))
    finally:
        store.close()
    reopened = JobStore.open(tmp_path)  # the next start sees the same
    rows = {row["id"]: row for row in reopened.videos()}
    reopened.close()
    assert {rows[ids[n]]["status"] for n in ("done", "queued1", "queued2")} == {"completed"}
    assert json.loads(rows[ids["running"]]["error"])["code"] == "interrupted"


def test_a_restored_queued_job_deleted_before_the_model_is_ready_never_runs(tmp_path):
    ids = killed_process_state(tmp_path)
    dispatcher = FakeDispatcher()
    store = ContentStore(3600, 1 << 20, state_dir=str(tmp_path))
    try:
        jobs = VideoJobs(dispatcher, store, 3600, model="wan21_tiny")
        jobs.resume()
        assert jobs.delete(ids["queued1"], "")["cancelled"] == "queued"
        dispatcher.replicas[0].started.set()
        dispatcher.wait_submitted(2)  # queued2 and late, the last two: queued1 was passed over
        assert [r.request_id for r, _ in dispatcher.submitted] == ["video-6", "video-7"]
    finally:
        store.close()


def test_another_model_fails_the_restored_queued_jobs(tmp_path):
    ids = killed_process_state(tmp_path)
    dispatcher = FakeDispatcher()
    dispatcher.replicas[0].started.set()
    store = ContentStore(3600, 1 << 20, state_dir=str(tmp_path))
    try:
        jobs = VideoJobs(dispatcher, store, 3600, model="flux_tiny")
        jobs.resume()
        error = ended(jobs, jobs.get(ids["queued1"], ""))["error"]
        assert error["code"] == "unavailable" and "now serves 'flux_tiny'" in error["message"]
        assert jobs.content(ids["done"], "") == b"mp4 of done"  # what was made stays served
        assert dispatcher.submitted == []
    finally:
        store.close()


def test_one_process_per_state_dir_and_refusals_name_the_dir(tmp_path):
    first = JobStore.open(tmp_path)
    try:
        with pytest.raises(DiffletError) as err:
            JobStore.open(tmp_path)
        assert err.value.where == "--state-dir"
        assert f"is in use by another difflet-runtime (pid {os.getpid()})" in err.value.message
    finally:
        first.close()
    JobStore.open(tmp_path).close()  # released by close (and by the kernel when a process dies)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "jobs.sqlite3").write_bytes(b"not a database" * 100)
    with pytest.raises(DiffletError, match="not a Difflet job store"):
        JobStore.open(bad)
    (tmp_path / "file").write_text("")
    with pytest.raises(DiffletError, match="file: cannot use it as the state directory"):
        JobStore.open(tmp_path / "file")


def test_kept_files_are_reindexed_at_startup(tmp_path):
    """Files past their expiry, missing, of another size, or never indexed are removed; the rest
    are served again with at most the current retention; a smaller bound drops the oldest."""
    store = ContentStore(3600, 1000, state_dir=str(tmp_path))
    for name in ("a.png", "b.png", "c.png", "d.png"):
        store.put(name, name.encode() * 10)
    store.close()
    content = tmp_path / "content"
    (content / "b.png").unlink()
    (content / "c.png").write_bytes(b"short")
    (content / "stray.png").write_bytes(b"x")
    db = sqlite3.connect(tmp_path / "jobs.sqlite3")
    with db:
        db.execute("UPDATE content SET expires = 1 WHERE name = 'a.png'")
    db.close()
    again = ContentStore(3600, 1000, state_dir=str(tmp_path))
    try:
        assert again.names() == ["d.png"] and again.get("d.png") == b"d.png" * 10
        assert sorted(p.name for p in content.iterdir()) == ["d.png"]
        assert again.used_bytes() == 50
    finally:
        again.close()
    smaller = ContentStore(3600, 10, state_dir=str(tmp_path))
    try:
        assert smaller.names() == [] and list(content.iterdir()) == []
    finally:
        smaller.close()


def test_state_dir_without_http_is_one_error_line(tmp_path):
    """Only the HTTP API keeps jobs: --state-dir alone is a usage error, before anything starts."""
    out = subprocess.run([sys.executable, "-m", "difflet.runtime.server", "--artifacts", str(tmp_path),
                          "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, timeout=WAIT_S)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: Invalid value for --state-dir: it keeps the HTTP API's jobs: give --http-port too"], out.stderr
    assert not (tmp_path / "state").exists()


def test_video_jobs_are_scoped_to_their_owner_across_a_restart(tmp_path):
    """Issue 31 item 2: with several API keys, a job is its key's only (the owner tag, auth.Keys):
    another key's holder gets 404 for it on every route (as for a job never made) and does not
    see it listed; the owner is recorded, so this holds after a restart too."""
    a, b = "k" + "a" * 16, "k" + "b" * 16
    store = ContentStore(3600, 1 << 20, state_dir=tmp_path)
    jobs = VideoJobs(FakeDispatcher(), store, 3600, model="wan21_tiny")
    mine = jobs.add(Job(request(1), None, owner=a), "wan21_tiny", "32x32", 9, 16.0)
    mine.job.finish("ok", "", {"mp4": b"mp4 of a"})
    ended(jobs, mine)
    queued = jobs.add(Job(request(2), None, owner=a), "wan21_tiny", "32x32", 9, 16.0)

    def scoped(jobs) -> None:
        assert {v.id for v in jobs.list(a)} == {queued.id, mine.id}
        assert jobs.list(b) == [] and jobs.list("") == []
        assert jobs.content(mine.id, a) == b"mp4 of a"
        for call in (lambda: jobs.get(mine.id, b), lambda: jobs.content(mine.id, b),
                     lambda: jobs.delete(queued.id, b), lambda: jobs.get(mine.id, "")):
            with pytest.raises(ApiError) as err:
                call()
            assert err.value.status == 404 and err.value.code == "not_found", err.value.message
        assert jobs.get(queued.id, a).status == "queued"  # b's DELETE did not touch it

    scoped(jobs)
    store.close()
    dispatcher = FakeDispatcher()
    again = VideoJobs(dispatcher, ContentStore(3600, 1 << 20, state_dir=tmp_path), 3600, model="wan21_tiny")
    try:
        scoped(again)
        dispatcher.replicas[0].started.set()
        again.resume()
        dispatcher.wait_submitted(1)
        assert dispatcher.jobs[0].owner == a  # resubmitted under its owner
    finally:
        again.store.close()


def test_a_version_1_job_store_gains_the_owner_column(tmp_path):
    """A state dir written before owners (format 1) opens: its jobs belong to the keyless owner."""
    (tmp_path / "content").mkdir()
    db = sqlite3.connect(tmp_path / "jobs.sqlite3")
    db.executescript("""CREATE TABLE videos (n INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
        request TEXT NOT NULL, model TEXT NOT NULL, size TEXT NOT NULL, frames INTEGER NOT NULL,
        fps REAL NOT NULL, status TEXT NOT NULL, progress INTEGER NOT NULL, error TEXT,
        created_at INTEGER NOT NULL, completed_at INTEGER, deadline REAL, expires REAL);
        CREATE TABLE content (name TEXT PRIMARY KEY, bytes INTEGER NOT NULL, expires REAL NOT NULL);
        PRAGMA user_version = 1;""")
    db.execute("INSERT INTO videos (id, request, model, size, frames, fps, status, progress, created_at) "
               "VALUES ('video_old', '{}', 'wan21_tiny', '32x32', 9, 16.0, 'queued', 0, 1)")
    db.commit()
    db.close()
    store = JobStore.open(tmp_path)
    try:
        assert [(r["id"], r["owner"]) for r in store.videos()] == [("video_old", "")]
    finally:
        store.close()
