"""HTTP API behaviours docs/serving.md documents (issue 35 item 4): a client that disconnects
while waiting cancels its job while one that only half-closes (SHUT_WR) gets its image, refusals for a missing or wrong API key are counted as
`unauthenticated` on both protocols, a video larger than the content bound fails its job with
`content_too_large`, and finished video job records are capped (oldest first).

Oracle: the documented protocol; counters are compared before and after within each test and
the expected changes are the requests the test made. The held request is held with the
DIFFLET_FAULTS hold-steps gate, so only a cancel can free its model process: the next request's
first step proves the disconnect cancelled it. The content bound and the record cap are checked
on the job store itself (VideoJobs over a ContentStore, a stand-in dispatcher): the smallest
--http-content-mb (1 MiB) is larger than any tiny model's video, and 10000 jobs would be a slow
test of one comparison.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from types import SimpleNamespace

import grpc
import pytest

from difflet.runtime import client
from difflet.runtime.demo import stop_server
from difflet.runtime.http.content import ContentStore
from difflet.runtime.http.errors import ApiError
from difflet.runtime.http.videos import VideoJobs
from http_util import call, call_json, start_http_server
from serving_util import WAIT_S, Stream

pytestmark = pytest.mark.slow  # starts a server

PROMPT = "a red fox in the snow"
KEY = "documented-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Served:
    def __init__(self, proc, grpc_address, http_address, hold) -> None:
        self.proc, self.grpc, self.http, self.hold = proc, grpc_address, http_address, hold


@pytest.fixture(scope="module")
def served(flux_tiny_art, tmp_path_factory):
    hold = tmp_path_factory.mktemp("hold") / "hold-steps"
    proc, grpc_address, http_address = start_http_server(flux_tiny_art, "--api-key", KEY, "--queue-size", "1",
                                                         env={"DIFFLET_FAULTS": f"hold-steps:{hold}"})
    yield Served(proc, grpc_address, http_address, hold)
    hold.unlink(missing_ok=True)
    assert stop_server(proc) == 0


@pytest.fixture
def server(served):
    yield served
    served.hold.unlink(missing_ok=True)


def scrape(http_address: str) -> dict[tuple, float]:
    """{(name, sorted label items): value} of GET /metrics (the key is needed there too)."""
    from prometheus_client.parser import text_string_to_metric_families

    status, _, text = call(http_address, "GET", "/metrics", headers=AUTH)
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


def delta(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def serving(grpc_address: str):
    return client.get_profile(grpc_address, api_key=KEY).serving


def test_a_client_that_disconnects_cancels_its_job(server):
    """A synchronous image request (1000 steps, held after its first) whose client closes the
    connection: the job is cancelled at a step boundary (the same model process then serves the
    next request: nothing was killed), counted as cancelled."""
    pid, recoveries = serving(server.grpc).processes[0].pid, serving(server.grpc).recoveries
    before = scrape(server.http)
    server.hold.touch()
    host, port = server.http.rsplit(":", 1)
    body = json.dumps({"prompt": PROMPT, "num_inference_steps": 1000}).encode()
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
    try:
        sock.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: " + server.http.encode()
                     + b"\r\nContent-Type: application/json\r\nAuthorization: Bearer " + KEY.encode()
                     + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        # the HTTP route answers nothing before its image, so its admission is seen in GetProfile
        # (polled: the server streams no per-replica state)
        end = time.monotonic() + WAIT_S
        while serving(server.grpc).processes[0].state != "busy":
            assert time.monotonic() < end, "the HTTP request never reached the model process"
            time.sleep(0.05)
        after_it = Stream(server.grpc, PROMPT, 2, steps=2, request_id="after-disconnect", api_key=KEY)
        assert after_it.wait_for("queued").position == 0  # behind the running HTTP request
        assert not after_it.done.is_set()
    finally:
        sock.close()
    after_it.wait_for("progress")  # the held HTTP request left the model process
    server.hold.unlink()
    result, error = after_it.finish()
    assert error is None and result.model_pid == pid
    assert (serving(server.grpc).processes[0].pid, serving(server.grpc).recoveries) == (pid, recoveries)
    after = scrape(server.http)
    assert delta(before, after, "difflet_requests_total", outcome="cancelled") == 1
    assert delta(before, after, "difflet_requests_total", outcome="ok") == 1


def test_a_client_that_half_closes_after_sending_gets_its_image(server):
    """Issue 31 finding 6: a client that shuts down its sending side (SHUT_WR) once the request is
    out was answered 409 "the client disconnected". Its request is held after the first step for
    3 s (the server probes the client every second meanwhile), then let go: the reply is the image,
    and nothing was cancelled."""
    before = scrape(server.http)
    server.hold.touch()
    host, port = server.http.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
    try:
        conn.request("POST", "/v1/images/generations", json.dumps({"prompt": PROMPT, "seed": 4,
                     "num_inference_steps": 3}), {"Content-Type": "application/json", **AUTH})
        conn.sock.shutdown(socket.SHUT_WR)
        end = time.monotonic() + WAIT_S
        while serving(server.grpc).processes[0].state != "busy":
            assert time.monotonic() < end, "the HTTP request never reached the model process"
            time.sleep(0.05)
        time.sleep(3.0)  # several probes while the half-closed client waits
        assert serving(server.grpc).processes[0].state == "busy"  # still its job: not cancelled
        server.hold.unlink()
        resp = conn.getresponse()  # skips the interim 100 Continue probes
        reply = json.loads(resp.read())
        assert resp.status == 200 and reply["data"][0]["b64_json"], reply
    finally:
        conn.close()
    after = scrape(server.http)
    assert delta(before, after, "difflet_requests_total", outcome="cancelled") == 0
    assert delta(before, after, "difflet_requests_total", outcome="ok") == 1


def test_requests_without_the_key_are_refused_and_counted_unauthenticated(server):
    """HTTP without a key or with a wrong one (401, before the body is read), /metrics without a
    key, gRPC without the key (UNAUTHENTICATED): 4 counted. The open routes (HTTP /health, gRPC
    health) answer without a key and are not counted; nothing reaches the queue."""
    before = scrape(server.http)
    for headers in ({}, {"Authorization": "Bearer not-the-key"}):
        status, reply = call_json(server.http, "POST", "/v1/images/generations", {"prompt": PROMPT},
                                  headers=headers)
        assert (status, reply["error"]["code"]) == (401, "invalid_api_key"), reply
    assert call(server.http, "GET", "/metrics")[0] == 401
    with pytest.raises(grpc.RpcError) as err:
        client.generate(server.grpc, PROMPT, 1, steps=2, timeout=30)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert call_json(server.http, "GET", "/health") == (200, {"status": "serving"})
    assert client.health_status(server.grpc) == "SERVING"
    after = scrape(server.http)
    changed = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in {*before, *after}
               if k[0] in ("difflet_rejects_total", "difflet_requests_total")
               and after.get(k, 0.0) != before.get(k, 0.0)}
    assert changed == {("difflet_rejects_total", (("reason", "unauthenticated"),)): 4}


# ---- the video job store (no server)

class Dispatcher:
    """Stands in for the Dispatcher: a job's events end when its `release` is set."""

    def events(self, job):
        job.release.wait(WAIT_S)
        yield from ()

    def cancel(self, job, code, message):
        return ""


def finished_job(mp4: bytes, released: bool = True):
    job = SimpleNamespace(code="ok", message="", result={"mp4": mp4}, dispatched=0.0, owner="",
                          fields=SimpleNamespace(seed=1, steps=2), release=threading.Event())
    if released:
        job.release.set()
    return job


def ended(jobs: VideoJobs, video):
    with jobs.changed:  # notified at every record change
        assert jobs.changed.wait_for(lambda: video.status in ("completed", "failed"), WAIT_S), "the job never ended"
    return video.to_json()


def test_a_video_larger_than_the_content_bound_fails_with_content_too_large():
    store = ContentStore(retention_s=3600, max_bytes=100)
    try:
        jobs = VideoJobs(Dispatcher(), store, retention_s=3600)
        fits, too_large = (jobs.add(finished_job(bytes(n)), "m", "32x32", 9, 8.0) for n in (100, 101))
        assert ended(jobs, fits)["status"] == "completed" and jobs.content(fits.id, "") == bytes(100)
        record = ended(jobs, too_large)
        assert (record["status"], record["error"]["code"]) == ("failed", "content_too_large"), record
        assert "101 bytes" in record["error"]["message"] and "bound of 100 bytes" in record["error"]["message"]
        with pytest.raises(ApiError) as err:
            jobs.content(too_large.id, "")
        assert (err.value.status, err.value.code) == (404, "not_ready")
        assert store.used_bytes() == 100  # the file that fits is kept, the other never stored
    finally:
        store.close()


def test_finished_job_records_are_capped_oldest_first():
    """The cap (10000 in the server) set to 3: of 5 jobs ended in turn, the 2 oldest records are
    gone (GET is 404) and the 3 newest kept; a job still running is never dropped, and when it
    ends it counts as the newest."""
    store = ContentStore(retention_s=3600, max_bytes=1 << 20)
    try:
        jobs = VideoJobs(Dispatcher(), store, retention_s=3600)
        jobs.MAX_RECORDS = 3
        running = jobs.add(finished_job(b"r", released=False), "m", "32x32", 9, 8.0)
        done = []
        for _ in range(5):
            done.append(jobs.add(finished_job(b"d"), "m", "32x32", 9, 8.0))
            assert ended(jobs, done[-1])["status"] == "completed"
        assert len(jobs._jobs) == 4  # held in memory as well, before anything reads the jobs
        assert {v.id for v in jobs.list("")} == {running.id, *(v.id for v in done[2:])}
        for gone in done[:2]:
            with pytest.raises(ApiError) as err:
                jobs.get(gone.id, "")
            assert err.value.status == 404
        running.job.release.set()
        assert ended(jobs, running)["status"] == "completed"
        assert {v.id for v in jobs.list("")} == {running.id, done[3].id, done[4].id}
    finally:
        store.close()
