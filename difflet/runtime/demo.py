"""`difflet demo`: the whole toolchain on a bundled model, one command (CPU; `--target cuda`: a CUDA device).

Models (`MODELS`): flux-shapes (default; the trained pipeline shipped in difflet/assets/flux-shapes,
so the image follows the prompt), and every bundled `*-tiny*` description (each family's real
pipeline at toy size with random:0 weights: noise-like output; the video models write MP4;
`*-tiny4`: heads that divide 4, for split layouts), so a new family's tiny description is a demo.
Stages (each timed): lower -> opt (--parallel, default tp1; --target, default cpu; inductor) -> codegen (the model's weights, programs
from the content-addressed store) -> start `difflet-runtime --port 0` and wait until it prints
"listening on HOST:PORT" (it does so only once SERVING) -> one Generate over gRPC -> write the
PNG (or MP4) -> SIGTERM the server and wait for its exit.

Invariant: a second run with the same store compiles nothing (codegen reports compiled 0).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from difflet.bundled import ASSETS_DIR, MODELS_DIR
from difflet.errors import DiffletError

SHAPES_WEIGHTS = ASSETS_DIR / "flux-shapes"
# name -> (model description, --weights); the DSL has no weights clause, so the pairing lives here
MODELS = {
    "flux-shapes": (MODELS_DIR / "flux-shapes.dsl", str(SHAPES_WEIGHTS)),
    **{p.stem: (p, "random:0") for p in sorted(MODELS_DIR.glob("*-tiny*.dsl"))},
}
DEFAULT_MODEL = "flux-shapes"
DEFAULT_PROMPT = "a yellow triangle on a black background"
SERVER_START_TIMEOUT_S = 600.0


@dataclass
class DemoReport:
    stages: list[tuple[str, float, str]] = field(default_factory=list)  # name, seconds, note

    def table(self) -> str:
        rows = ["| stage | time | note |", "|---|---:|---|"]
        rows += [f"| {name} | {secs:.2f} s | {note} |" for name, secs, note in self.stages]
        return "\n".join(rows)


class _Timer:
    def __init__(self, report: DemoReport, name: str) -> None:
        self.report, self.name, self.note = report, name, ""

    def __enter__(self) -> "_Timer":
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.report.stages.append((self.name, time.perf_counter() - self.start, self.note))


def _codegen_counts(result) -> str:
    """codegen's CodegenResult -> "compiled N, reused M" (its fields list component names)."""
    return f"compiled {len(result.compiled)}, reused {len(result.reused)}"


def launch_server(art: Path, args: tuple[str, ...] = (), env: dict | None = None,
                  preexec_fn=None) -> subprocess.Popen:
    """Start `difflet-runtime --port 0 ARGS` on ART (stdout a pipe, stderr a temporary file);
    `preexec_fn` runs in the child before it starts (e.g. resource limits)."""
    cmd = [sys.executable, "-m", "difflet.runtime.server", "--artifacts", str(art), "--port", "0",
           *args]
    # stderr goes to a file: an unread pipe would fill up and block the server
    errlog = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errlog, text=True,
                            env=None if env is None else {**os.environ, **env}, preexec_fn=preexec_fn)
    proc.errlog = errlog
    return proc


def read_line(proc: subprocess.Popen, prefix: str, timeout: float = SERVER_START_TIMEOUT_S) -> str:
    """The rest of the server's next stdout line starting with `prefix`; DiffletError (with the
    server's error line) if it exits first."""
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if line.startswith(prefix):
            return line[len(prefix):].strip()
        if time.monotonic() > deadline:
            break
    stop_server(proc)
    proc.errlog.seek(0)
    err = [ln for ln in proc.errlog.read().strip().splitlines() if ln.startswith("error:")] or ["no error line"]
    raise DiffletError(f"difflet-runtime exited (code {proc.returncode}) before serving: "
                       f"{err[-1]}", where=str(proc.args[4]))


def start_server(art: Path, timeout: float = SERVER_START_TIMEOUT_S, args: tuple[str, ...] = (),
                 env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """Start `difflet-runtime --port 0` on ART; returns (process, "host:port") once it is SERVING."""
    proc = launch_server(art, args, env)
    return proc, read_line(proc, "listening on ", timeout)  # printed only once SERVING


def stop_server(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM and wait for the exit; SIGKILL only if it does not stop within `timeout`."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def quiet_libraries() -> None:
    """Keep the demo's output to its table: no weight-loading progress bars or library warnings."""
    import warnings

    import diffusers
    import transformers

    warnings.filterwarnings("ignore", category=FutureWarning)
    for lib in (diffusers, transformers):
        lib.utils.logging.set_verbosity_error()
        lib.utils.logging.disable_progress_bar()


def compile_model(model: str, art: Path, store: Path, report: DemoReport | None = None,
                  log: Callable[[str], None] | None = None, verbose: bool = False,
                  parallel: str = "tp1", attention: str | None = None, target: str = "cpu"):
    """Lower, optimize (PARALLEL, default tp1; TARGET, default cpu; inductor) and codegen bundled MODEL into a
    fresh ART dir (programs from STORE); returns codegen's result. ART is a view of the store:
    rebuilt each call."""
    from difflet.codegen.driver import codegen
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    dsl, weights = MODELS[model]
    if not dsl.is_file():
        raise DiffletError("the bundled model description is missing", where=str(dsl))
    report = report if report is not None else DemoReport()
    with _Timer(report, "lower"):
        module = lower_file(str(dsl))
    with _Timer(report, "opt"):
        module = optimize(module, parallel=parallel, target=target, backend="inductor", attention=attention)
        from difflet.passes.built import reasons

        unbuilt = reasons(module, "inductor")  # refuse before any compile, in codegen's words
        if unbuilt:
            raise DiffletError(f"{parallel}: not built for {unbuilt[0][0]}: {unbuilt[0][1]}", where="--parallel")
    with _Timer(report, "codegen") as t:
        if art.exists():
            shutil.rmtree(art)
        result = codegen(module, weights, art, backend="inductor", store=store,
                         log=log or (lambda *a: None), verbose=verbose)
        t.note = _codegen_counts(result)
    return result


def run_demo(output: Path | None, prompt: str, store: Path | None, seed: int = 42,
             log: Callable[[str], None] = print, model: str = DEFAULT_MODEL,
             verbose: bool = False, parallel: str = "tp1", attention: str | None = None,
             target: str = "cpu", lossless_video: bool = False) -> DemoReport:
    from difflet.codegen.store import default_store_dir
    from difflet.runtime import client

    if model not in MODELS:
        raise DiffletError(f"unknown demo model {model!r} (one of {', '.join(MODELS)})",
                           where="--model")
    store = Path(store) if store is not None else default_store_dir()
    if not verbose:
        quiet_libraries()
    report = DemoReport()
    art = store / "demo-art" / (model if parallel == "tp1" and not attention
                                else f"{model}-{parallel}-{attention or 'default'}")
    art = art if target == "cpu" else art.with_name(f"{art.name}-{target}")
    compile_model(model, art, store, report, log=log if verbose else None, verbose=verbose,
                  parallel=parallel, attention=attention, target=target)
    with _Timer(report, "load+warm-up") as t:
        proc = launch_server(art, ("--lossless-video",) if lossless_video else ())
        ready = read_line(proc, "model process 0 ready: ")  # its imports, load and warm-up
        address = read_line(proc, "listening on ")
        t.note = f"difflet-runtime on {address}; {ready.split(', ', 2)[-1]}"
    try:
        with _Timer(report, "request") as t:
            reply = client.generate(address, prompt, seed, timeout=600)
            tm = reply.timings
            t.note = (f"encode {tm.encode_ms:.0f} ms, denoise {tm.denoise_ms:.0f} ms, "
                      f"decode {tm.decode_ms:.0f} ms")
    finally:
        stop_server(proc)
    if output is None:
        output = Path("demo.mp4" if reply.mp4 else "demo.png")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(reply.mp4 or reply.png)
    log(report.table())
    frames = f"x{reply.frames} frames at {reply.fps:g} fps" if reply.frames else ""
    log(f"wrote {output} ({reply.width}x{reply.height}{frames}, seed {reply.seed}, {reply.steps} steps)")
    return report
