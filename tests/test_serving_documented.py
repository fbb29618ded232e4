"""Serving behaviours docs/serving.md documents, held by a real difflet-runtime over gRPC
(issue 35 item 4): the stop signals with requests in flight, a failed warm-up check, --no-verify,
`kill -USR1` on either process, and the counters and gauges of /metrics.

Oracle: the documented protocol, with every expected value worked out here, not read from the
server: step counts are what the test asked for, cached steps follow the documented cadence rule
(the first and last 5 steps full; in between, one full step then N-1 cached), a flat decoder's
colour is its checkpoint's conv_out bias mapped to [0, 255] as diffusers' VaeImageProcessor
maps it, counters are compared before and after within each test. Requests are held with the
DIFFLET_FAULTS hold-steps gate, never a clock; the one time bound is a lower one (the 5 s drain
is never cut short), as test_serving_faults.py bounds its deadline. No test leaves a request in
the module's server (each waits for every answer and cancels none), so its gauges read 0 at the
start of every test.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from conftest import shared_store_dir
from difflet.runtime import client
from difflet.runtime.demo import launch_server, read_line, stop_server
from serving_util import WAIT_S, HealthWatch, Stream, copy_art, scrape, wait_exit

pytestmark = pytest.mark.slow  # starts servers (and compiles flux-tiny's batch programs if missing)

PROMPT = "a lighthouse at dusk"
SHUTDOWN_DRAIN_S = 5.0  # docs: on SIGINT/SIGTERM "accepted requests get up to 5 s"


def cached_by_rule(steps: int, cadence: int, keep: int = 5) -> set[int]:
    """docs/architecture.md "Step caching": the first and last `keep` steps are full; in the
    window between, cadence:N makes one step full then N-1 cached (0-based step indices)."""
    return {i for i in range(keep, steps - keep) if (i - keep) % cadence}


class StderrTail:
    """The server's stderr read in a thread, so a test can wait for what the server writes."""

    def __init__(self, pipe) -> None:
        self.text, self._changed = "", threading.Condition()
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe) -> None:
        for line in pipe:
            with self._changed:
                self.text += line
                self._changed.notify_all()

    def wait_for(self, pattern: str, since: int) -> str:
        with self._changed:
            assert self._changed.wait_for(lambda: re.search(pattern, self.text[since:], re.M), WAIT_S), \
                f"stderr never showed {pattern!r}: {self.text[since:][-2000:]!r}"
            return self.text[since:]

    def seek(self, _offset: int) -> None:  # read_line (demo.py) reads a failed server's `errlog`
        pass

    def read(self) -> str:
        return self.text


@pytest.fixture(scope="module")
def batch_art(flux_tiny_ckpt, tmp_path_factory):
    """flux-tiny lowered with --batch-sizes 1,2,4 (tests/test_batching.py's artifact: the same store
    programs), so concurrent requests share batched denoiser calls."""
    from conftest import FLUX_TINY_DSL
    from difflet.codegen.driver import codegen
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    out = tmp_path_factory.mktemp("documented") / "art"
    codegen(optimize(lower_file(str(FLUX_TINY_DSL), batches=[1, 2, 4])), str(flux_tiny_ckpt), out,
            store=shared_store_dir(), log=lambda *_: None)
    return out


@pytest.fixture(scope="module")
def served(batch_art, tmp_path_factory):
    """One server for the module (--max-batch 4 by default: the artifact's largest batch size),
    its stderr a pipe read in a thread."""
    hold = tmp_path_factory.mktemp("hold") / "hold-steps"
    cmd = [sys.executable, "-m", "difflet.runtime.server", "--artifacts", str(batch_art), "--port", "0",
           "--queue-size", "2", "--metrics-port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "DIFFLET_FAULTS": f"hold-steps:{hold}"})
    proc.errlog = stderr = StderrTail(proc.stderr)
    metrics = read_line(proc, "metrics on ")
    yield SimpleNamespace(proc=proc, address=read_line(proc, "listening on "), metrics=metrics, hold=hold,
                          stderr=stderr)
    hold.unlink(missing_ok=True)
    assert stop_server(proc) == 0


@pytest.fixture
def server(served):
    yield served
    served.hold.unlink(missing_ok=True)


def model_pid(address: str) -> int:
    (process,) = client.get_profile(address).serving.processes
    return process.pid


def changes(before: dict, after: dict, name: str) -> dict:
    """{label value (rows or reason; "" for none): after - before} of every sample of `name` that changed."""
    keys = {k for k in (*before, *after) if k[0] == name}
    return {dict(k[1]).get("rows", dict(k[1]).get("reason", "")): after.get(k, 0.0) - before.get(k, 0.0)
            for k in keys if after.get(k, 0.0) != before.get(k, 0.0)}


def test_sigusr1_dumps_python_stacks_of_either_process_to_stderr(server):
    """Each process prints its threads' stacks (its main thread's function named) and goes on
    serving: without the handler, SIGUSR1's default action would end it."""
    pid, recoveries = model_pid(server.address), client.get_profile(server.address).serving.recoveries
    for target, path, function in ((server.proc.pid, "difflet/runtime/server.py", "main"),
                                   (pid, "difflet/runtime/model_process.py", "serve")):
        since = len(server.stderr.text)
        os.kill(target, signal.SIGUSR1)
        dump = server.stderr.wait_for(rf'^  File "[^"]*{re.escape(path)}", line \d+ in {function}$', since)
        assert "(most recent call first):" in dump
    reply = client.generate(server.address, PROMPT, 3, steps=2, timeout=WAIT_S)
    assert server.proc.poll() is None and reply.model_pid == pid == model_pid(server.address)
    assert client.get_profile(server.address).serving.recoveries == recoveries


def test_step_counters_follow_the_requests_and_the_cadence_rule(server):
    """Requests one at a time: difflet_steps_total grows by the steps asked, cached_steps_total by
    the cadence rule's count, denoiser calls by the rest; a request alone is not 'batched'."""
    asked = [(3, "off", 0), (20, "cadence:2", 2), (16, "cadence:4", 4)]
    before = scrape(server.metrics)
    replies = []
    for steps, cache, n in asked[:2]:
        replies.append(client.generate(server.address, PROMPT, 4, steps=steps, cache=cache, timeout=WAIT_S))
    steps, cache, n = asked[2]
    stream = Stream(server.address, PROMPT, 4, steps=steps, cache=cache)
    replies.append(stream.finish()[0])
    flags = []
    while (event := stream.events.get(timeout=WAIT_S))[0] != "end":
        if event[0] == "progress":
            flags.append((event[1].step, event[1].cached))
    after = scrape(server.metrics)
    want_cached = [cached_by_rule(steps, n) if n else set() for steps, _, n in asked]
    assert [len(c) for c in want_cached] == [0, 5, 4]  # the rule worked by hand: {6,8,10,12,14}, {6,7,8,10}
    # every step reported, 1-based, cached exactly where the rule says
    assert flags == [(i + 1, i in want_cached[2]) for i in range(steps)]
    for reply, (steps, cache, _), cached in zip(replies, asked, want_cached):
        assert (reply.steps, reply.cache, reply.cached_steps, reply.denoiser_calls) == \
            (steps, cache, len(cached), steps - len(cached))
    total_steps, total_cached = sum(s for s, _, _ in asked), sum(map(len, want_cached))
    assert changes(before, after, "difflet_steps_total") == {"": total_steps}
    assert changes(before, after, "difflet_cached_steps_total") == {"": total_cached}
    assert changes(before, after, "difflet_denoiser_calls_total") == {"": total_steps - total_cached}
    assert changes(before, after, "difflet_batched_requests_total") == {}
    assert after[("difflet_requests_in_flight", ())] == 0


def test_in_flight_gauge_and_batched_requests_counter(server):
    """Two requests of one size in one model process (--max-batch 4): the in-flight gauge counts
    both (none waits in the queue); `first` is held after its first step, so `second`'s first
    denoiser call waits for `first`'s next one (the BatchGate joins the calls of every request in
    its denoise loop), and both complete having shared calls of 2 rows: rows="2" grows by 2.
    (`second` is dispatched before `first` is released and needs only its text encoding to reach
    the gate, while `first` has 999 steps left: it joins them.)"""
    before = scrape(server.metrics)
    server.hold.touch()
    first = Stream(server.address, PROMPT, 1, steps=1000, request_id="batch-first")
    first.wait_for("progress")
    now = scrape(server.metrics)
    assert (now[("difflet_requests_in_flight", ())], now[("difflet_queue_depth", ())]) == (1, 0)
    second = Stream(server.address, "a blue sphere", 2, steps=4, request_id="batch-second")
    assert second.wait_for("queued").position == 0  # admitted and, with a free slot, dispatched at once
    now = scrape(server.metrics)
    assert (now[("difflet_requests_in_flight", ())], now[("difflet_queue_depth", ())]) == (2, 0)
    server.hold.unlink()
    replies = [stream.finish() for stream in (first, second)]
    assert [error for _, error in replies] == [None, None]
    after = scrape(server.metrics)
    assert changes(before, after, "difflet_batched_requests_total") == {"2": 2}
    assert changes(before, after, "difflet_steps_total") == {"": 1004}
    assert after[("difflet_requests_in_flight", ())] == 0


def test_a_duplicate_request_id_is_refused_and_counted(server):
    """Refused INVALID_ARGUMENT while the first request of that id runs (held after its first
    step), counted as duplicate_id only; once the first is answered, the id is free again."""
    before = scrape(server.metrics)
    server.hold.touch()
    held = Stream(server.address, PROMPT, 1, steps=3, request_id="dup")
    held.wait_for("progress")
    with pytest.raises(grpc.RpcError) as err:
        client.generate(server.address, PROMPT, 2, request_id="dup", timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "request_id: 'dup' is already in flight"
    after = scrape(server.metrics)
    assert changes(before, after, "difflet_rejects_total") == {"duplicate_id": 1}
    server.hold.unlink()
    result, error = held.finish()
    assert error is None and result.request_id == "dup"
    assert client.generate(server.address, PROMPT, 2, steps=2, request_id="dup", timeout=WAIT_S).request_id == "dup"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop_signal_drains_accepted_requests_then_answers_unavailable(flux_tiny_slow_art, tmp_path, signum):
    """One model process: `finishing` runs (held after step 1), `cut` waits in the queue. After
    the signal health is NOT_SERVING and a new request is refused UNAVAILABLE; released,
    `finishing` completes; `cut` then runs and is held again, so it cannot finish: it is answered
    UNAVAILABLE, never before the 5 s drain; the model process is stopped and the exit code is 0."""
    hold = tmp_path / "hold-steps"
    proc = launch_server(flux_tiny_slow_art, ("--queue-size", "2", "--threads", "1"),
                         env={"DIFFLET_FAULTS": f"hold-steps:{hold}"})
    try:
        address = read_line(proc, "listening on ")
        pid = model_pid(address)
        hold.touch()
        finishing = Stream(address, PROMPT, 1, steps=2, request_id="finishing")
        finishing.wait_for("progress")
        cut = Stream(address, PROMPT, 2, steps=1000, request_id="cut")
        assert cut.wait_for("queued").position == 0
        watch = HealthWatch(address)
        try:
            watch.wait_for(["SERVING"])
            signalled = time.monotonic()
            proc.send_signal(signum)
            watch.wait_for(["SERVING", "NOT_SERVING"])
        finally:
            watch.close()  # an open Watch call would hold the server's own gRPC stop grace
        with pytest.raises(grpc.RpcError) as refused:
            client.generate(address, PROMPT, 3, steps=2, timeout=30)
        assert (refused.value.code(), refused.value.details()) == \
            (grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
        hold.unlink()
        result, error = finishing.finish()
        assert error is None and (result.steps, result.model_pid) == (2, pid)
        hold.touch()  # `cut` (1000 steps at 128x128, many seconds) now runs and is held again
        result, error = cut.finish()
        waited = time.monotonic() - signalled
        assert result is None and (error.code(), error.details()) == \
            (grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
        assert waited >= SHUTDOWN_DRAIN_S - 0.01, waited  # monotonic clocks; 10 ms for rounding
        assert proc.wait(WAIT_S) == 0
        assert wait_exit(pid, WAIT_S)
    finally:
        hold.unlink(missing_ok=True)
        stop_server(proc)


def start_refused(art, *args) -> str:
    """The one error line of a server that did not start (one that says it is listening fails
    the test at once, instead of serving until a timeout)."""
    proc = launch_server(art, args)
    try:
        started = next((line for line in proc.stdout if line.startswith("listening on")), None)
    finally:
        stop_server(proc)
    proc.errlog.seek(0)
    stderr = proc.errlog.read()
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert not started and "Traceback" not in stderr, stderr[-2000:]
    assert len(errors) == 1 and stderr.strip().endswith(errors[0]), stderr[-2000:]
    # a model process that failed to load or warm up stops startup as a refused artifact
    assert proc.returncode == 2, (proc.returncode, errors)
    return errors[0]


def vae_with_conv_out(art_dir, tmp_path, fill: float):
    """A copy of ART whose VAE decoder's last convolution has every weight `fill`."""
    import torch
    from safetensors.torch import load_file, save_file

    art = copy_art(art_dir, tmp_path / "art")
    path = art / "weights" / "vae.rank0.safetensors"
    weights = load_file(path)
    weights["model.decoder.conv_out.weight"] = torch.full_like(weights["model.decoder.conv_out.weight"], fill)
    save_file(weights, path)
    return art


def test_no_verify_loads_modified_weights_and_the_warm_up_refuses_a_non_finite_decoder(flux_tiny_art, tmp_path):
    art = vae_with_conv_out(flux_tiny_art, tmp_path, float("nan"))
    line = start_refused(art)  # verified (the default): the changed file is refused by its sha256
    assert "weights/vae.rank0.safetensors: weights of 'vae' is corrupt or was modified" in line
    line = start_refused(art, "--no-verify")  # not verified: loaded, run, and caught by the warm-up
    assert "model process 0: RuntimeError: warm-up generation (32x32) failed its checks: " \
           "decoder output is not finite" in line


def test_a_warm_up_whose_output_is_one_colour_stops_startup(flux_tiny_art, flux_tiny_ckpt, tmp_path):
    """conv_out's weights zeroed: every pixel is conv_out's bias b, which the host maps as
    VaeImageProcessor does: round(clamp(b / 2 + 0.5, 0, 1) * 255) per channel."""
    from safetensors.torch import load_file

    bias = load_file(Path(flux_tiny_ckpt) / "vae" / "diffusion_pytorch_model.safetensors")["decoder.conv_out.bias"]
    colour = tuple(((bias / 2 + 0.5).clamp(0, 1).numpy() * 255).round().astype("uint8").tolist())  # float32
    assert len(set(colour)) > 1  # not grey: a check of max == min over all values would pass it
    line = start_refused(vae_with_conv_out(flux_tiny_art, tmp_path, 0.0), "--no-verify")
    assert line.endswith(f"failed its checks: output is constant (every pixel is {colour})"), line
