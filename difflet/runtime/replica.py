"""One replica: a model process and the supervisor thread that feeds it, watches it, replaces it.

States: starting -> ready <-> busy; any -> recovering (process died, or did not stop within
--grace after a cancel) -> ready again, or -> failed (its replacement did not pass the startup
checks; dispatch to this replica stays paused). stopped after `stop()`.

Invariants:
- At most `slots` requests (the server's --max-batch; 1 = one at a time) are in a model process
  at once (`jobs`); the dispatcher assigns one only while the state is ready or busy and a slot
  is free, and the supervisor sends it.
- The supervisor waits on three things at once: the pipe, the process sentinel (its exit), and
  a wake pipe poked on assign/cancel. A death is seen as soon as the OS reports it, so the
  running request is answered UNAVAILABLE at once, never after a timeout.
- A cancelled request keeps its slot until the process says it stopped (or it is killed after
  `grace`): more than `slots` generations never overlap. A kill (which answers every request in
  the process) is confirmed (join) before a replacement starts.
- A replacement only loads the saved artifacts (startup checks + load_artifacts + warm-up).
- Model processes are not daemonic (a split program's model process starts rank workers); each
  leads its own process group, and every path that ends one (stop, crash, grace timeout, a
  failed start) SIGKILLs that whole group and joins the process, so no model process or rank
  worker outlives its replica. Each process runs with its own TMPDIR, removed on that same path:
  what its loaders extract (AOTInductor packages, 2 MB+ per program) never outlives it.
- Messages are `messages` Structs; a message that does not decode is treated as a broken
  process (killed and replaced), never read with defaults.
- A supervisor thread that ends by a bug is not serving (`alive`) and is replaced by `restart`
  (the dispatcher's watchdog): its process killed, its requests answered, a new process loaded.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from multiprocessing.connection import wait
from typing import Any, Callable

import msgspec

from difflet.runtime import messages as msg
from difflet.runtime.jobs import Job
from difflet.runtime.procs import CTX, LIVE, kill_group

START_TIMEOUT_S = 1800.0
LONGEST_WAIT_S = 3600.0  # wait() overflows past 2**31 ms, which would end the supervisor thread


class Replica:
    def __init__(self, index: int, config: dict[str, Any], dispatcher, precheck: Callable[[], None],
                 grace: float) -> None:
        self.index, self.config, self.grace = index, dict(config), grace
        self.dispatcher, self.precheck = dispatcher, precheck
        self.state, self.pid, self.generation, self.served, self.compiles = "starting", 0, -1, 0, 0
        self.error = ""
        self.slots = max(1, int(config.get("max_batch", 1)))
        self.jobs: list[Job] = []  # in the process or about to be sent, in assignment order
        self._unsent: list[Job] = []
        self._cancels: list[int] = []  # seqs to send Cancel for (supervisor thread sends)
        self._wake_r, self._wake_w = CTX.Pipe(duplex=False)
        self._wake_lock = threading.Lock()
        self._stop = threading.Event()
        self._proc = None
        self._conn = None
        self._tmp: str | None = None  # the running process's TMPDIR, removed once it has exited
        self.started = threading.Event()  # set once the first start succeeded or failed
        # tests only: the supervisor raises at generation 0's first step (a bug, as issue 31 found)
        self._fault = "supervisor-error" in os.environ.get("DIFFLET_FAULTS", "").split(",")
        self._thread = threading.Thread(target=self._supervise, name=f"replica-{index}", daemon=True)

    # ---- called by the dispatcher (under its lock)
    def start(self) -> None:
        self._thread.start()

    def free_slots(self) -> int:
        return self.slots - len(self.jobs) if self.state in ("ready", "busy") else 0

    def assign(self, job: Job) -> None:
        self.jobs.append(job)
        self._unsent.append(job)
        self.state = "busy"
        self.wake()

    def cancel(self, job: Job) -> None:
        """Ask the process to stop `job` at its next step boundary (no-op if it is not ours)."""
        if job in self.jobs and job.seq >= 0:
            self._cancels.append(job.seq)
            self.wake()

    def wake(self) -> None:
        with self._wake_lock:
            self._wake_w.send_bytes(b"w")

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.wake()
        self._thread.join(timeout)

    def alive(self) -> bool:
        """False once the supervisor thread has ended by an error (not by `stop` or a failed start)."""
        return self._thread.is_alive() or self._stop.is_set() or self.state == "failed" \
            or self._thread.ident is None

    def restart(self) -> None:
        """Replace a dead supervisor (watchdog thread): kill its process, answer its requests,
        and start a supervisor that loads a replacement."""
        self.state, self.error = "recovering", "the supervisor thread failed (see the server log)"
        self._kill()
        self._fail_jobs("the replica's supervisor failed (see the server log); a replacement is loading")
        self._thread = threading.Thread(target=self._supervise, name=self._thread.name, daemon=True)
        self._thread.start()

    # ---- the supervisor thread
    def _supervise(self) -> None:
        while not self._stop.is_set():
            if not self._spawn():
                return
            reason = self._serve()
            if self._stop.is_set():
                break
            self.dispatcher.model_lost(self, reason)
        self._shutdown()

    def _spawn(self) -> bool:
        """Start a model process and wait for ready/failed/death; False if it could not start."""
        from difflet.runtime import model_process

        self.generation += 1
        self.pid, self.compiles = 0, 0
        try:
            self.precheck()
            conn, child = CTX.Pipe(duplex=True)
            cores = self.config.get("cores") or []
            self._tmp = tempfile.mkdtemp(prefix=f"difflet-model{self.index}-")
            config = dict(self.config, generation=self.generation, tmpdir=self._tmp,
                          cores=cores[self.index] if self.index < len(cores) else [], replica=self.index)
            proc = CTX.Process(target=model_process.serve, args=(child, config),
                                name=f"difflet-model-{self.index}", daemon=False)
            proc.start()
            LIVE.add(proc)
            child.close()
            self._proc, self._conn = proc, conn
            message = self._first_message(proc, conn)
        except Exception as err:
            message = msg.Failed("invalid", str(err))
        if not isinstance(message, msg.Ready):
            self._kill()
            self.state, self.error = "failed", message.message
            self.started.set()
            self.dispatcher.model_failed(self, message.kind, message.message)
            return False
        info = message
        self.pid, self.compiles, self.served, self.error = info.pid, info.compiles, 0, ""
        self.state = "ready"
        self.dispatcher.model_ready(self, info)  # before `started`: its log line precedes "listening"
        self.started.set()
        return True

    def _first_message(self, proc, conn):
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._stop.is_set():
            ready = wait([conn, proc.sentinel, self._wake_r], timeout=deadline - time.monotonic())
            if conn in ready:
                try:
                    message = msg.decode_to_api(conn.recv_bytes())
                except (EOFError, OSError):
                    pass
                except msgspec.ValidationError as err:
                    return msg.Failed("error", f"the model process sent a malformed message: {err}")
                else:
                    if isinstance(message, (msg.Ready, msg.Failed)):
                        return message
                    return msg.Failed("error", f"the model process sent {type(message).__name__} "
                                               f"before Ready")
            if proc.sentinel in ready or conn in ready:
                proc.join()
                return msg.Failed("error", f"the model process exited during startup "
                                           f"(exit code {proc.exitcode})")
            if self._wake_r in ready:
                self._drain_wake()
            if time.monotonic() > deadline:
                return msg.Failed("error", f"the model process was not ready within {START_TIMEOUT_S:.0f} s")
        return msg.Failed("error", "stopped during startup")

    def _serve(self) -> str:
        """Feed and watch the running process; returns why it has to be replaced."""
        proc, conn = self._proc, self._conn
        while not self._stop.is_set():
            self._send_pending(conn)
            now, timeouts = time.monotonic(), []
            for job in list(self.jobs):
                if job.cancel_at is not None:
                    timeouts.append(max(0.0, job.cancel_at + self.grace - now))
                elif job.deadline is not None:
                    timeouts.append(max(0.0, job.deadline - now) + 0.01)
            soonest = min(timeouts, default=None)
            ready = wait([conn, proc.sentinel, self._wake_r],
                         timeout=None if soonest is None else min(soonest, LONGEST_WAIT_S))
            if self._wake_r in ready:
                self._drain_wake()
            if conn in ready:
                try:
                    message = msg.decode_to_api(conn.recv_bytes())
                except (EOFError, OSError):
                    message = None
                except msgspec.ValidationError as err:  # a broken process: replace it
                    self.state = "recovering"
                    self._kill()
                    self._fail_jobs(f"the model process (pid {self.pid}) sent a malformed "
                                    f"message ({err}); a replacement is loading")
                    return "crash"
                if message is not None:
                    self._on_message(message)
                    continue
            if proc.sentinel in ready or not proc.is_alive():
                proc.join()
                code = proc.exitcode
                why = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                self.state = "recovering"  # before the jobs are handed back: no new assignment
                self._kill()  # its process group: rank workers it may have left behind
                self._fail_jobs(f"the model process (pid {self.pid}) died ({why}) during the "
                                f"request; a replacement is loading")
                return "crash"
            for job in list(self.jobs):
                if job.deadline is not None and job.cancel_at is None and time.monotonic() >= job.deadline:
                    self.dispatcher.expire(job)
            if any(j.cancel_at is not None and time.monotonic() >= j.cancel_at + self.grace
                   for j in list(self.jobs)):
                self.state = "recovering"
                self._kill()  # confirmed exit before any replacement starts
                self._fail_jobs("the model process did not stop within the grace period")
                return "timeout"
        return "stopped"

    def _send_pending(self, conn) -> None:
        """Send assigned jobs (Run) and requested cancellations (Cancel), in that order."""
        while self._unsent:
            job = self._unsent.pop(0)
            job.seq = self.dispatcher.next_seq()
            job.started(self)
            try:
                conn.send_bytes(msg.encode(msg.Run(job.seq, job.fields)))
            except (BrokenPipeError, OSError):
                pass  # the death is seen on the sentinel
            if job.done.is_set():  # answered (deadline/cancel) before it was sent
                self.cancel(job)
        while self._cancels:
            try:
                conn.send_bytes(msg.encode(msg.Cancel(self._cancels.pop(0))))
            except (BrokenPipeError, OSError):
                pass

    def _on_message(self, message: msg.ToApi) -> None:
        seq = getattr(message, "seq", None)
        job = next((j for j in self.jobs if j.seq == seq and seq is not None and seq >= 0), None)
        if job is None:
            return  # a late message of a request already handed back (or a stray Ready/Failed)
        if isinstance(message, msg.Step):
            if self._fault and self.generation == 0:
                raise RuntimeError("DIFFLET_FAULTS supervisor-error")
            job.progress(message.step, message.total, message.cached, self.pid)
        elif isinstance(message, msg.Done):
            self.compiles = message.result.compiles
            self.served += 1
            self.dispatcher.finished(self, job, "ok", "", msgspec.structs.asdict(message.result))
        elif isinstance(message, msg.Error):
            self.dispatcher.finished(self, job, message.kind, message.message, None)
        elif isinstance(message, msg.Cancelled):
            self.dispatcher.finished(self, job, "cancelled", "cancelled at a step boundary", None)

    def _fail_jobs(self, message: str) -> None:
        """Hand back every job: unsent ones keep their place in the queue, sent ones fail."""
        unsent, self._unsent, self._cancels = set(map(id, self._unsent)), [], []
        for job in reversed(list(self.jobs)):  # requeued ones go back to the front in their order
            self.dispatcher.finished(self, job, "unavailable", message, None, requeue=id(job) in unsent)

    def _drain_wake(self) -> None:
        while self._wake_r.poll():
            self._wake_r.recv_bytes()

    def _kill(self) -> None:
        """SIGKILL the model process's group (it and any workers it started), confirm the exit."""
        if self._proc is not None:
            kill_group(self._proc)
        if self._conn is not None:
            self._conn.close()
        if self._tmp is not None:  # what its loaders extracted (AOTInductor packages) goes with it
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._proc = self._conn = self._tmp = None

    def _shutdown(self) -> None:
        proc, conn = self._proc, self._conn
        if proc is not None and proc.is_alive():
            try:
                conn.send_bytes(msg.encode(msg.Stop()))
            except (BrokenPipeError, OSError):
                pass
            proc.join(5.0)
        self._kill()
        self.state = "stopped"
