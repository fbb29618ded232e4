"""Video jobs survive `kill -9` of the API process (issue 31 item 3 and finding 10), on a real
difflet-runtime serving wan2.1-tiny (test_http_video's artifact) with --http-port and --state-dir.

The first server has one job completed, one failed (its deadline passed while it waited), one
running and two queued: the running one is held after its first step by the DIFFLET_FAULTS
hold-steps gate and the server runs one request at a time, so the queued ones cannot have
started, however fast or slow the machine (no sleeps, no wall-clock windows). Then `kill -9` of
the API process; its model process and forkserver must exit on their own (the pipe's EOF). A
second server on the same state dir, without the gate, must answer for every job exactly once:
completed and failed ones as before (the MP4 byte-identical), the running one failed
`interrupted` (never run twice), the queued ones run once (its metrics count exactly two
generations), and no `difflet-content-*` directory left in the servers' TMPDIR. A third server
on the same dir is refused with one error line.

On main (before the job store) this fails: `--state-dir` is not an option; without it, the
restarted server answers 404 for every job (records were in memory only) and the killed
server's content directory stays in its TMPDIR.
"""
from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import av
import pytest

from difflet.runtime.demo import stop_server
from http_util import WAIT_S, call, call_json, sse, start_http_server
from serving_util import wait_exit
from test_http_video import FRAMES, PROMPT, SIZE, wan_art  # noqa: F401 (the fixture)

pytestmark = pytest.mark.slow  # starts three servers of a video model


def create(http_address: str, seed: int, **body) -> dict:
    status, reply = call_json(http_address, "POST", "/v1/videos",
                              {"prompt": PROMPT, "seed": seed, "num_inference_steps": 2, **body})
    assert status == 200, reply
    return reply


def until(http_address: str, video_id: str, wanted) -> dict:
    """The job's first SSE record that `wanted` accepts (the stream ends at the job's end)."""
    for record in sse(http_address, "GET", f"/v1/videos/{video_id}/events"):
        if wanted(record):
            return record
    raise AssertionError(f"{video_id}: the events ended first")


def ended(record: dict) -> bool:
    return record.get("status") in ("completed", "failed")


def outcomes(http_address: str) -> dict[str, float]:
    """difflet_requests_total by outcome, from GET /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    status, _, text = call(http_address, "GET", "/metrics")
    assert status == 200
    return {s.labels["outcome"]: s.value for family in text_string_to_metric_families(text.decode())
            for s in family.samples if s.name == "difflet_requests_total"}


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (its forkserver, the model processes, the resource tracker)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def test_video_jobs_survive_kill_9_of_the_api_process(wan_art, tmp_path):
    state, tmp, hold = tmp_path / "state", tmp_path / "tmp", tmp_path / "hold-steps"
    tmp.mkdir()
    args = ("--queue-size", "4", "--threads", "1", "--state-dir", str(state))
    proc, _, http = start_http_server(wan_art, *args, env={"TMPDIR": str(tmp),
                                                           "DIFFLET_FAULTS": f"hold-steps:{hold}"})
    try:
        done = create(http, 1)
        assert until(http, done["id"], ended)["status"] == "completed"
        status, _, mp4 = call(http, "GET", f"/v1/videos/{done['id']}/content")
        assert status == 200
        hold.touch()  # from here every request is held after each step until the gate is removed
        running = create(http, 2, num_inference_steps=3)
        assert until(http, running["id"], lambda r: r["progress"] > 0)["progress"] == 33  # held after step 1
        queued = [create(http, seed) for seed in (3, 4)]
        assert [job["status"] for job in queued] == ["queued", "queued"]
        late = create(http, 5, timeout=0.001)  # queued behind the held job: only its deadline ends it
        assert until(http, late["id"], ended)["error"]["code"] == "deadline"
        before = {v["id"]: v["status"] for v in call_json(http, "GET", "/v1/videos")[1]["data"]}
        assert before == {done["id"]: "completed", running["id"]: "in_progress", queued[0]["id"]: "queued",
                          queued[1]["id"]: "queued", late["id"]: "failed"}
        assert outcomes(http) == {"ok": 1.0, "deadline": 1.0}
        below = descendants(proc.pid)
        assert below, "no model process under the API process"
    finally:
        proc.kill()  # SIGKILL: no shutdown path runs
        proc.wait()
    assert all(wait_exit(pid, WAIT_S) for pid in below), "a model process outlived its API process"
    hold.unlink()

    proc, _, http = start_http_server(wan_art, *args, env={"TMPDIR": str(tmp)})
    try:
        records = call_json(http, "GET", "/v1/videos")[1]["data"]
        assert sorted(v["id"] for v in records) == sorted(before)  # each job once, none lost
        after = {v["id"]: v for v in records}
        assert after[done["id"]]["status"] == "completed"
        assert call(http, "GET", f"/v1/videos/{done['id']}/content")[2] == mp4
        assert after[late["id"]]["error"]["code"] == "deadline"
        interrupted = after[running["id"]]
        assert (interrupted["status"], interrupted["error"]["code"]) == ("failed", "interrupted")
        for job in queued:  # submitted again by the new server, same id
            assert until(http, job["id"], ended)["status"] == "completed"
            status, _, video = call(http, "GET", f"/v1/videos/{job['id']}/content")
            with av.open(io.BytesIO(video)) as container:
                frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
            assert status == 200 and len(frames) == FRAMES and frames[0].shape == (SIZE, SIZE, 3)
        assert outcomes(http) == {"ok": 2.0}  # the queued two, once each; the interrupted never
        assert call_json(http, "GET", f"/v1/videos/{running['id']}")[1]["status"] == "failed"
        assert not list(tmp.glob("difflet-content-*")), list(tmp.iterdir())
        kept = sorted(p.name for p in (state / "content").iterdir())
        assert kept == sorted(f"{v['id']}.mp4" for v in (done, *queued))

        second = subprocess.run([sys.executable, "-m", "difflet.runtime.server", "--artifacts", str(wan_art),
                                 "--port", "0", "--http-port", "0", "--state-dir", str(state)],
                                capture_output=True, text=True, timeout=WAIT_S)
        assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr
        (line,) = second.stderr.strip().splitlines()
        assert line == (f"error: --state-dir: {state} is in use by another difflet-runtime "
                        f"(pid {proc.pid}); give each server its own --state-dir"), line
    finally:
        assert stop_server(proc) == 0
    assert not list(tmp.glob("difflet-content-*")) and kept == sorted(p.name for p in (state / "content").iterdir())
