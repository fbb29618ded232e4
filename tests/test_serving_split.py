"""A split (2-rank, TP2) flux-tiny4 artifact served through the real `difflet-runtime` (issue 12).

The model process of a split artifact starts rank workers of its own, so it cannot be daemonic;
this serves one as a user does and checks:
- the image equals the TP1 artifact's image served the same way (same checkpoint, prompt, seed,
  steps), within max pixel difference 1 and >= 99% identical pixels;
- SIGKILL of the model process mid-life: its rank workers die with it (its process group), a
  replacement loads from the artifacts and serves the same image;
- after the server stops, no model process, forkserver or rank worker it started remains
  (by the pids recorded while it served).

Compiled programs come from the shared test store (the TP1 programs are the ones
tests/test_split_e2e.py uses).
"""
from __future__ import annotations

import io
import os
import signal
from pathlib import Path

import grpc
import numpy as np
import pytest

from difflet.runtime import client
from difflet.runtime.demo import start_server, stop_server
from serving_util import HealthWatch, Stream, wait_exit

pytestmark = pytest.mark.slow

FLUX_TINY4 = Path(__file__).resolve().parent.parent / "models" / "flux-tiny4.dsl"
REQUEST = dict(prompt="a red cube on a checkered floor", seed=7, steps=4)


@pytest.fixture(scope="module")
def arts(difflet_test_store, tmp_path_factory):
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.driver import codegen
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    modules = {p: optimize(lower_file(str(FLUX_TINY4)), parallel=p, target="cpu", backend="inductor")
               for p in ("tp1", "tp2")}
    ckpt = resolve_weights(modules["tp1"], "random:0", difflet_test_store)  # one checkpoint for both
    out = {}
    for name, module in modules.items():
        out[name] = tmp_path_factory.mktemp(f"flux-tiny4-{name}")
        codegen(module, str(ckpt), out[name], store=difflet_test_store, log=lambda *_: None)
    return out


def _pixels(png: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, pgid) of a live process, None if it is gone (a zombie counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] == "Z" else (int(fields[1]), int(fields[2]))


def _group(leader: int) -> dict[int, int]:
    """pid -> ppid of every live process in `leader`'s process group, the leader excluded."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != leader:
            st = _stat(int(entry))
            if st is not None and st[1] == leader:
                out[int(entry)] = st[0]
    return out


def _rank_workers(model_pid: int) -> list[int]:
    """The model process's rank workers: its group's processes whose parent is not the model
    process itself (they are forked by the forkserver the model process started)."""
    group = _group(model_pid)
    assert group, f"model process {model_pid} started no helper processes"
    return sorted(pid for pid, ppid in group.items() if ppid != model_pid)


def _all_exit(pids: set[int], what: str) -> None:
    for pid in pids:
        assert wait_exit(pid, 60), f"pid {pid} {what}"


def _serve_once(art: Path) -> bytes:
    proc, address = start_server(art)
    try:
        return client.generate(address, **REQUEST, timeout=300).png
    finally:
        assert stop_server(proc) == 0


def test_tp2_artifact_serves_the_tp1_image_and_leaves_no_rank_worker(arts):
    reference = _pixels(_serve_once(arts["tp1"]))
    proc, address = start_server(arts["tp2"])
    recorded: set[int] = set()
    try:
        first = client.generate(address, **REQUEST, timeout=300)
        workers = _rank_workers(first.model_pid)
        assert len(workers) == 2, workers  # world 2: one worker per rank
        recorded |= {first.model_pid, *_group(first.model_pid)}

        # crash path: the whole group goes, a replacement (new workers) serves the same image
        watch = HealthWatch(address)
        try:
            os.kill(first.model_pid, signal.SIGKILL)
            watch.wait_for(["NOT_SERVING", "SERVING"])
        finally:
            watch.close()
        _all_exit(recorded, "of the killed model process's group survived")
        second = client.generate(address, **REQUEST, timeout=300)
        assert second.model_pid != first.model_pid and second.png == first.png
        assert len(_rank_workers(second.model_pid)) == 2
        recorded |= {second.model_pid, *_group(second.model_pid)}
    finally:
        assert stop_server(proc) == 0
    _all_exit(recorded, "outlived difflet-runtime")

    split = _pixels(first.png)
    assert reference.shape == split.shape == (32, 32, 3)
    assert int(reference.max()) > int(reference.min())  # a constant image makes the check vacuous
    diff = np.abs(reference.astype(np.int16) - split.astype(np.int16))
    # TP2 reorders float32 sums only: at most one rounding step of uint8, on a few pixels; a
    # wrong split (a lost shard, a wrong head order) moves most pixels by far more
    assert int(diff.max()) <= 1, int(diff.max())
    assert float((diff == 0).all(axis=-1).mean()) >= 0.99


def test_sigkill_of_one_rank_worker_mid_request_is_a_clear_error_and_the_replica_recovers(arts):
    """A rank worker killed while its split program runs a request: that request gets an error
    naming the dead rank (seen within SplitProgram.POLL_S, not after gloo's collective timeout),
    the model process is replaced from the artifacts (0 compiles), health returns to SERVING,
    the next request is byte-identical to one before the fault, and nothing is left behind."""
    proc, address = start_server(arts["tp2"])
    recorded: set[int] = set()
    try:
        before = client.generate(address, **REQUEST, timeout=300)
        victim = _rank_workers(before.model_pid)[1]
        recorded |= {before.model_pid, *_group(before.model_pid)}
        watch = HealthWatch(address)
        try:
            # 1000 steps: the kill lands right after step 1 reports, long before the last one
            stream = Stream(address, "a long request", 11, steps=1000)
            stream.wait_for("progress")
            os.kill(victim, signal.SIGKILL)
            result, error = stream.finish()
            assert result is None and error is not None
            assert error.code() == grpc.StatusCode.INTERNAL, error
            assert f"died (signal {signal.SIGKILL})" in error.details(), error.details()
            assert "replaced from the artifacts" in error.details(), error.details()
            watch.wait_for(["NOT_SERVING", "SERVING"])
        finally:
            watch.close()
        _all_exit(recorded, "of the broken model process's group survived")
        after = client.generate(address, **REQUEST, timeout=300)
        assert after.model_pid != before.model_pid and after.png == before.png
        processes = client.get_profile(address, timeout=30).serving.processes
        assert [p.compiles for p in processes] == [0] and processes[0].generation == 1
        recorded |= {after.model_pid, *_group(after.model_pid)}
    finally:
        assert stop_server(proc) == 0
    _all_exit(recorded, "outlived difflet-runtime")
