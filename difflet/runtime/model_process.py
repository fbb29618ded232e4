"""The model process: loads one profile's saved artifacts, warms up, runs one request at a time.

Started by `replica.Replica` with multiprocessing's spawn context; speaks over one duplex pipe.
  parent -> child: ("run", seq, fields)   fields as `admission.Admission.check` returns them
                   ("stop",)
  child -> parent: ("ready", info) | ("failed", kind, message)           once, after start
                   ("step", seq, step, total, cached)                     after every step
                   ("done", seq, result) | ("error", seq, kind, message) | ("cancelled", seq)
Cancellation needs no message: the parent writes the seq to cancel into a shared integer, and
`should_stop()` (checked at every step boundary) compares it with the running request's seq.

Invariants:
- It only ever loads (`ModelRunner.from_artifacts(verify=...)` -> load_artifacts); it never
  compiles. Calls to the compile entry points are counted (`compiles` in every report) so a
  test can see that the count stays 0.
- The warm-up generation must pass its checks before "ready" is sent.
- SIGINT is ignored (the API process decides when model processes stop); EOF on the pipe (the
  API process went away) ends it. It leads its own process group, so the API process can kill
  it together with any rank workers its programs started (split components).
- DIFFLET_FAULTS (tests only): "hang-on-cancel" blocks forever when asked to stop (a
  generation stuck in a device call, the case --grace exists for);
  "hold-load:PATH" makes the first process (generation 0) wait until a line can be read from
  the FIFO at PATH before loading.
"""
from __future__ import annotations

import inspect
import os
import signal
import time
from typing import Any, Callable

COMPILE_ENTRY_POINTS = (("torch._inductor", "aoti_compile_and_package"), ("torch", "compile"))


def _count_compiles() -> list[int]:
    """Wrap the compile entry points so any call inside this process is counted."""
    import importlib

    count = [0]
    for module_name, attr in COMPILE_ENTRY_POINTS:
        module = importlib.import_module(module_name)
        original = getattr(module, attr)

        def counted(*args, __original=original, **kwargs):
            count[0] += 1
            return __original(*args, **kwargs)

        setattr(module, attr, counted)
    return count


def _faults(generation: int) -> tuple[bool, str | None]:
    spec = [f.strip() for f in os.environ.get("DIFFLET_FAULTS", "").split(",") if f.strip()]
    hold = next((f.split(":", 1)[1] for f in spec if f.startswith("hold-load:")), None)
    return "hang-on-cancel" in spec, hold if generation == 0 else None


def _load(config: dict[str, Any]):
    from difflet.runtime.runner import ModelRunner

    kwargs = {"verify": bool(config.get("verify", True))}
    if "cache" in inspect.signature(ModelRunner.from_artifacts).parameters:
        kwargs["cache"] = config["cache"]
    elif config["cache"] != "off":
        from difflet.errors import DiffletError

        raise DiffletError(f"{config['cache']!r}: this build's runner has no step caching", where="--cache")
    return ModelRunner.from_artifacts(config["root"], **kwargs)


def _hooked_generate(runner, params, on_step: Callable, should_stop: Callable):
    """`runner.generate` with step hooks: the runner's own when it has them, else a wrapper
    around the denoiser program (one call = one step; checked before each call)."""
    from difflet.runtime.cancel import Cancelled

    if "should_stop" in inspect.signature(runner.generate).parameters:
        return runner.generate(params, on_step=on_step, should_stop=should_stop), None
    names = [c.name for c in runner.module.components("denoiser")]
    calls = [0]
    originals = {n: runner.env.programs[n] for n in names}

    def wrap(program):
        def step(*args, **kwargs):
            if should_stop():
                raise Cancelled()
            out = program(*args, **kwargs)
            calls[0] += 1
            on_step(calls[0] - 1, params.steps, False)
            return out
        return step

    runner.env.programs.update({n: wrap(p) for n, p in originals.items()})
    try:
        return runner.generate(params), {"denoiser_calls": calls[0], "cached_steps": 0}
    finally:
        runner.env.programs.update(originals)


def _resolve(runner, fields: dict[str, Any]):
    fields = dict(fields)
    cache = fields.pop("cache", None)
    if "cache" in inspect.signature(runner.resolve).parameters:
        return runner.resolve(**fields, cache=cache)
    return runner.resolve(**fields)


def _run(conn, runner, seq: int, fields: dict[str, Any], should_stop: Callable, compiles: list[int],
         default_cache: str) -> None:
    from difflet.errors import DiffletError
    from difflet.runtime.cancel import Cancelled

    def on_step(step: int, total: int, cached: bool) -> None:
        conn.send(("step", seq, int(step) + 1, int(total), bool(cached)))

    try:
        params = _resolve(runner, fields)
        result, fallback_stats = _hooked_generate(runner, params, on_step, should_stop)
    except Cancelled:
        conn.send(("cancelled", seq))
        return
    except DiffletError as err:
        conn.send(("error", seq, "invalid", err.message))
        return
    except Exception as err:  # a failed generation must not end the process
        conn.send(("error", seq, "internal", f"{type(err).__name__}: {err}"))
        return
    stats = dict(getattr(result, "stats", None) or fallback_stats or {})
    p = result.params
    conn.send(("done", seq, {
        "png": result.png, "mp4": getattr(result, "mp4", b""), "fps": float(getattr(result, "fps", 0.0)),
        "frames": 0 if getattr(result, "video", None) is None else int(result.video.shape[0]),
        "seed": p.seed, "steps": p.steps, "guidance": p.guidance,
        "height": p.height, "width": p.width, "request_id": p.request_id,
        "timings": dict(result.timings), "cache": fields.get("cache") or default_cache,
        "denoiser_calls": int(stats.get("denoiser_calls", p.steps)),
        "cached_steps": int(stats.get("cached_steps", 0)), "compiles": compiles[0]}))


def serve(conn, cancel_upto, config: dict[str, Any]) -> None:
    """Process entry point (spawned): load, warm up, report, then serve "run" messages."""
    os.setpgrp()  # its own process group: a kill also reaches rank workers it started
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` dumps stacks
    hang_on_cancel, hold = _faults(int(config.get("generation", 0)))
    try:
        import torch

        torch.set_num_threads(max(1, int(config.get("threads", 1))))
        compiles = _count_compiles()
        if hold:
            with open(hold) as fifo:
                fifo.readline()
        start = time.perf_counter()
        runner = _load(config)
        loaded = time.perf_counter()
        runner.warm_up()
        warm = time.perf_counter()
    except Exception as err:
        from difflet.errors import DiffletError

        kind = "invalid" if isinstance(err, DiffletError) else "error"
        conn.send(("failed", kind, str(err) if kind == "invalid" else f"{type(err).__name__}: {err}"))
        return
    conn.send(("ready", {"pid": os.getpid(), "load_s": loaded - start, "warm_up_s": warm - loaded,
                         "compiles": compiles[0]}))

    current = [0]

    def should_stop() -> bool:
        stop = cancel_upto.value >= current[0]
        while stop and hang_on_cancel:
            time.sleep(3600)
        return stop

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        if message[0] == "run":
            _, seq, fields = message
            current[0] = seq
            _run(conn, runner, seq, fields, should_stop, compiles, config["cache"])
