"""Resident rank workers: one process per rank over gloo, driving one split program together.

`SplitProgram(node, degrees, loader, per_rank_args)` starts `world` worker processes; each
initializes the gloo default group, calls `make_groups(degrees)` *first* (compiled programs
bake in group names, which are torch's creation counter), then builds its runner with
`loader(rank, groups, *per_rank_args[rank])`. A call sends the same full inputs to every rank,
every rank runs its runner (the runners do their own scatter/gather), and rank 0's outputs come
back.

Invariants:
- Same call convention as codegen's `Program`: `__call__(*tensors) -> tuple[Tensor, ...]` on
  full, rank-0-visible tensors, checked against the IR input types first (it wraps a Program).
- This module imports difflet.codegen.program lazily (Program, for the call convention), a
  leaf that imports nothing of codegen or parallel, so no import cycle runs through here; kept
  so the runtime can use either kind of program.
- `loader` is importable by name (a module-level function) and returns `runner(*tensors)`.
- A failing rank raises `RankError` with its traceback, a rank worker that dies raises it within
  `POLL_S` naming the rank and signal; a hang is bounded by `timeout` (and a rank whose call
  outlives it dumps its Python stack to stderr). After
  an error or `close()` the program is unusable and no worker outlives it (also on GC/exit).
- Calls are serialized (one in flight): the ranks' collectives must pair up in order. `send` /
  `receive` split one call for a caller that overlaps programs (parallel/cfg_program.py).

Compiled rank programs run with the GIL released (parallel.aoti_runner): torch's AOTI binding
holds it across the program's collective waits while gloo's worker threads may need it (to drop a
finished collective's tensors) under their group's work mutex, which deadlocked tp2cp2 ranks in
different collectives. A loader's runner must not hold the GIL while it waits on a collective.
"""
from __future__ import annotations

import io
import os
import queue
import shutil
import threading
import time
import traceback
from datetime import timedelta

import torch

from difflet.parallel.launch import RankError, rendezvous
from difflet.parallel.main_module import main_not_inherited


def _dumps(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(payload: bytes):
    return torch.load(io.BytesIO(payload), weights_only=False)


def _worker(rank, world, init_method, degrees, loader, args, inbox, outbox, threads, timeout) -> None:
    import faulthandler
    import sys

    import torch.distributed as dist

    torch.set_num_threads(threads)  # ranks share the cores: oversubscription only adds noise
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        dist.init_process_group("gloo", init_method=init_method, rank=rank,
                                world_size=world, timeout=timedelta(seconds=120))
        from difflet.parallel.groups import make_groups

        groups = make_groups(degrees)  # before any other group: names must match the compile
        runner = loader(rank, groups, *args)
        outbox.put((rank, "ready", b""))
    except BaseException:  # noqa: BLE001 - every failure must reach the host, not hang it
        outbox.put((rank, "error", traceback.format_exc()))
        return
    while True:
        msg = inbox.get()
        if msg is None:
            break
        # a call outliving the host's timeout leaves this rank's stack on stderr (hang diagnosis)
        faulthandler.dump_traceback_later(timeout, exit=False, file=sys.stderr)
        try:
            with torch.no_grad():
                out = tuple(runner(*_loads(msg)))
            faulthandler.cancel_dump_traceback_later()
            outbox.put((rank, "ok", _dumps(out) if rank == 0 else b""))
        except BaseException:  # noqa: BLE001
            outbox.put((rank, "error", traceback.format_exc()))
            break
    dist.destroy_process_group()


POLL_S = 0.2  # how often a waiting call checks that every rank worker is alive


def _exit_text(code) -> str:
    return f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"


class SplitProgram:
    """A split component's program over `world` resident rank workers (see module docstring)."""

    def __init__(self, node, degrees: dict, loader, per_rank_args: list[tuple], timeout: float = 300.0,
                 threads: int = 1, first_rank: int = 0) -> None:
        import torch.multiprocessing as mp

        from difflet.codegen.program import Program

        self.world = len(per_rank_args)
        self.first_rank = first_rank  # errors name rank r as first_rank + r (a cfg group's global rank)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._broken: str | None = None
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "difflet.parallel.workers"])
        self._outbox = ctx.Queue()
        self._inboxes = [ctx.Queue() for _ in range(self.world)]
        init_method, self._rendezvous = rendezvous()
        self._procs = [ctx.Process(target=_worker, daemon=True,
                                   args=(r, self.world, init_method, dict(degrees), loader, tuple(per_rank_args[r]),
                                         self._inboxes[r], self._outbox, threads, timeout))
                       for r in range(self.world)]
        with main_not_inherited():  # forkserver hands each child __main__ to import (main_module.py)
            for p in self._procs:
                p.start()
        self._program = Program(node, self._dispatch)
        self.node, self.name = node, node.name
        self.inputs, self.outputs = self._program.inputs, self._program.outputs
        try:
            self._collect("loading")
        except BaseException:
            self.close()
            raise

    def _collect(self, what: str):
        """Wait for one report per rank; return rank 0's payload; on any error, break."""
        payload = None
        end = time.monotonic() + self.timeout
        for _ in range(self.world):
            while True:
                try:  # short waits: a rank that died is seen now, not after the collective timeout
                    rank, status, data = self._outbox.get(timeout=min(POLL_S, max(0.0, end - time.monotonic())))
                    break
                except queue.Empty:
                    dead = self._dead()
                    if dead:
                        self._broken = "rank worker " + ", ".join(
                            f"{self.first_rank + r} died ({_exit_text(code)})" for r, code in dead) + f" while {what}"
                        raise RankError(self._broken) from None
                    if time.monotonic() >= end:
                        self._broken = f"rank workers did not finish {what} within {self.timeout:.0f}s"
                        raise RankError(f"{self._broken}; exit codes {[p.exitcode for p in self._procs]}") from None
            if status == "error":
                # a peer killed mid-collective surfaces as this rank's error: name the dead one
                dead = [(r, c) for r, c in self._dead(wait=1.0, others_than=rank) if c != 0]
                last = (data.strip().splitlines() or ["?"])[-1]
                at = self.first_rank
                self._broken = (f"rank worker {at + dead[0][0]} died ({_exit_text(dead[0][1])}) while {what} "
                                f"(rank {at + rank}: {last})" if dead else f"rank {at + rank} failed while {what}: {last}")
                raise RankError(f"{self._broken}\n{data}")
            if rank == 0:
                payload = data
        return payload

    def _dead(self, wait: float = 0.0, others_than: int = -1) -> list[tuple[int, int | None]]:
        """(rank, exit code) of every worker (but `others_than`) that exited, waiting up to
        `wait` s for one."""
        end = time.monotonic() + wait
        while True:
            dead = [(r, p.exitcode) for r, p in enumerate(self._procs)
                    if r != others_than and not p.is_alive() and p.exitcode != 0]
            if dead or time.monotonic() >= end:
                return dead
            time.sleep(0.05)

    def _dispatch(self, *tensors):
        with self._lock:
            self.send(*tensors)
            return self.receive()

    def send(self, *tensors) -> None:
        """Start one call on every rank without waiting (the caller serializes send/receive
        pairs; CfgProgram starts both guidance passes before collecting either)."""
        if self._broken:
            raise RankError(f"split program {self.name!r} is unusable: {self._broken}")
        msg = _dumps(tuple(t.contiguous() for t in tensors))
        for box in self._inboxes:
            box.put(msg)

    def receive(self) -> tuple:
        """The outputs of the call `send` started (rank 0's); RankError as `__call__`."""
        return _loads(self._collect("running"))

    def __call__(self, *tensors):
        return self._program(*tensors)

    def unchecked(self, *tensors):
        """A call whose tensors are not the node's IR inputs (a block-mode rank's part selector
        and its part's own inputs: codegen/block_programs.BlockRank); the caller checked them."""
        return self._dispatch(*tensors)

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        if not getattr(self, "_procs", None):
            return
        self._broken = self._broken or "closed"
        for box, p in zip(self._inboxes, self._procs):
            if p.is_alive():
                box.put(None)
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        self._procs = []
        shutil.rmtree(self._rendezvous, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter teardown
            pass

    def __repr__(self) -> str:
        return (f"SplitProgram({self.name} on {self.world} ranks: {[v.name for v in self.inputs]} -> "
                f"{[v.name for v in self.outputs]})")
