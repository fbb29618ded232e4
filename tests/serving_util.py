"""Helpers for the serving tests: real difflet-runtime processes, streams in threads, health
watches, process-exit waits (pidfd), metric scrapes. No sleeps: every wait is on a condition.
"""
from __future__ import annotations

import os
import queue
import select
import shutil
import threading
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from difflet.runtime import client
from difflet.runtime.service import SERVICE_NAME

WAIT_S = 300.0  # generous bound for "eventually" on a loaded 2-core machine


def copy_art(src: Path, dst: Path) -> Path:
    """A real copy of ART (ART's programs are hard links into the store: never write to those)."""
    shutil.copytree(src, dst, copy_function=shutil.copyfile)
    return dst


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def wait_exit(pid: int, timeout: float) -> bool:
    """True once process `pid` has exited (waits on a pidfd, no polling)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


class Stream:
    """A GenerateStream consumed in a thread: events go to `events`; `result`/`error` at the end."""

    def __init__(self, address: str, prompt: str, seed: int, timeout: float | None = WAIT_S, **fields):
        self.events: queue.Queue = queue.Queue()
        self.result = self.error = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        args=(address, prompt, seed, timeout, fields))
        self._thread.start()

    def _run(self, address, prompt, seed, timeout, fields) -> None:
        try:
            for event in client.generate_stream(address, prompt, seed, timeout=timeout, **fields):
                kind = event.WhichOneof("event")
                self.events.put((kind, getattr(event, kind)))
                if kind == "result":
                    self.result = event.result
        except grpc.RpcError as err:
            self.error = err
        except Exception as err:  # not expected: kept so a test failure shows it
            self.error = err
        finally:
            self.events.put(("end", None))
            self.done.set()

    def wait_for(self, kind: str, timeout: float = WAIT_S):
        """The next event of `kind` (skipping others); AssertionError if the stream ends first."""
        while True:
            got, value = self.events.get(timeout=timeout)
            if got == kind:
                return value
            assert got != "end", f"stream ended before a {kind!r} event: {self.error}"

    def finish(self, timeout: float = WAIT_S):
        assert self.done.wait(timeout), "stream did not finish"
        return self.result, self.error


class HealthWatch:
    """Records every health status the server announces, from now on, in a thread."""

    def __init__(self, address: str) -> None:
        self.statuses: list[str] = []
        self._changed = threading.Condition()
        self._channel = client.channel(address)
        self._stream = health_pb2_grpc.HealthStub(self._channel).Watch(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            for reply in self._stream:
                with self._changed:
                    self.statuses.append(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
                    self._changed.notify_all()
        except grpc.RpcError:
            pass

    def _seen(self, sequence: list[str]) -> bool:
        it = iter(self.statuses)
        return all(any(s == want for s in it) for want in sequence)

    def has_seen(self, sequence: list[str]) -> bool:
        """Whether `sequence` has appeared in order (not necessarily adjacent) so far."""
        with self._changed:
            return self._seen(sequence)

    def wait_for(self, sequence: list[str], timeout: float = WAIT_S) -> list[str]:
        """Wait until `sequence` appears in order (not necessarily adjacent) among the statuses."""
        with self._changed:
            assert self._changed.wait_for(lambda: self._seen(sequence), timeout), \
                f"health went {self.statuses}, wanted {sequence}"
            return list(self.statuses)

    def close(self) -> None:
        self._stream.cancel()
        self._channel.close()


def scrape(metrics_address: str) -> dict[tuple, float]:
    """{(name, sorted label items): value} of the server's Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=30).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}
