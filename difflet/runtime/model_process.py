"""The model process: loads one profile's saved artifacts, warms up, runs up to `max_batch`
requests at a time (each on its own thread; their denoiser calls batch, runtime/batching.py).

Started by `replica.Replica` (non-daemonic: a split program starts rank workers of its own);
speaks over one duplex pipe in msgspec messages (difflet/runtime/messages.py), one msgpack
frame per `send_bytes`:
  API -> model:  Run(seq, fields) | Cancel(seq) | Stop
  model -> API:  Ready(...) | Failed(kind, message)           once, after start
                 Step(seq, step, total, cached)                after every step
                 Done(seq, result) | Error(seq, kind, message) | Cancelled(seq)
The main thread only reads the pipe: a Run starts a request thread, a Cancel marks its seq, and
that request's `should_stop()` (checked at every step boundary) sees the mark. Replies are sent
under one lock (one frame at a time on the pipe).

Invariants:
- It only ever loads (`ModelRunner.from_artifacts(verify=...)` -> load_artifacts); it never
  compiles. Calls to the compile entry points are counted (`compiles` in every report) so a
  test can see that the count stays 0.
- The warm-up generation must pass its checks before Ready is sent.
- SIGINT is ignored (the API process decides when model processes stop); EOF on the pipe (the
  API process went away) ends it. It leads its own process group, so the API process can kill
  it together with any rank workers its programs started (split components).
- A message it cannot decode is a bug in the API process: it ends (the API process sees the
  exit and replaces it), never guesses.
- A split program whose rank worker died or failed is unusable: the request gets that error
  and the process exits (EXIT_BROKEN_PROGRAM), so the API process replaces it from the artifacts.
- DIFFLET_FAULTS (tests only): "hang-on-cancel" blocks forever when asked to stop (a
  generation stuck in a device call, the case --grace exists for);
  "hold-load:PATH" makes the first process (generation 0) wait until a line can be read from
  the FIFO at PATH before loading; "hold-steps:PATH" holds every request after each step's
  progress while the file PATH exists, until it is removed or the request is cancelled (so a
  test keeps a request running for as long as it needs, however fast the model).
"""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable

from difflet.runtime import messages as msg

EXIT_BROKEN_PROGRAM = 70  # a split program's rank worker died or failed: its ranks are unusable
COMPILE_ENTRY_POINTS = (("torch._inductor", "aoti_compile_and_package"), ("torch._inductor", "aot_compile"),
                        ("torch", "compile"))
# what every model process imports before it serves (measured with `python -X importtime`:
# torch, the AOTI package loader, and what the warm-up pulls in lazily: transformers'
# AutoTokenizer, diffusers' torch_utils/image_processor, scipy.stats via the flow-match
# scheduler, PIL's PNG writer) and the AOTI loader's CPU-ISA probe (runtime/preload.py); the
# forkserver does them once, so a (re)start skips them
PRELOAD = ("torch", "torch._inductor.package", "safetensors.torch", "difflet.runtime.runner",
           "difflet.codegen.artifacts", "difflet.codegen.inductor", "difflet.runtime.model_process",
           "transformers.models.auto.tokenization_auto", "diffusers.utils.torch_utils",
           "diffusers.image_processor", "scipy.stats", "PIL.PngImagePlugin",
           "difflet.runtime.preload")  # the last: it probes the CPU's vector ISA once


def preload_modules(family: str) -> list[str]:
    """Modules the forkserver imports for a model process of `family` (its host steps too)."""
    from difflet.families import FAMILIES, module_name

    return [*PRELOAD, *([module_name(family, "host")] if family in FAMILIES else [])]


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


def _faults(generation: int) -> tuple[bool, str | None, str | None]:
    """(hang-on-cancel, hold-load FIFO for generation 0, hold-steps file) from DIFFLET_FAULTS."""
    spec = [f.strip() for f in os.environ.get("DIFFLET_FAULTS", "").split(",") if f.strip()]
    hold = next((f.split(":", 1)[1] for f in spec if f.startswith("hold-load:")), None)
    steps = next((f.split(":", 1)[1] for f in spec if f.startswith("hold-steps:")), None)
    return "hang-on-cancel" in spec, hold if generation == 0 else None, steps


def _load(config: dict[str, Any]):
    from difflet.runtime.runner import ModelRunner

    runner = ModelRunner.from_artifacts(config["root"], verify=bool(config.get("verify", True)),
                                        cache=config["cache"], max_batch=int(config.get("max_batch", 1)),
                                        lossless_video=bool(config.get("lossless_video", False)),
                                        calibrations=config.get("calibrations"))
    if config.get("loras"):
        runner.load_loras([(name, path, float(scale)) for name, path, scale in config["loras"]])
    return runner


_SEND_LOCK = threading.Lock()


def _send(conn, message: msg.ToApi) -> None:
    with _SEND_LOCK:
        conn.send_bytes(msg.encode(message))


def _run(conn, runner, run: msg.Run, should_stop: Callable, compiles: list[int],
         default_cache: str, hold: Callable[[], None] = lambda: None) -> None:
    from difflet.errors import DiffletError
    from difflet.runtime.cancel import Cancelled

    seq, fields = run.seq, run.fields

    def on_step(step: int, total: int, cached: bool) -> None:
        _send(conn, msg.Step(seq, int(step) + 1, int(total), bool(cached)))
        hold()

    try:
        params = runner.admitted(fields)  # validated once, in the API process
        result = runner.generate(params, on_step=on_step, should_stop=should_stop)
    except Cancelled:
        _send(conn, msg.Cancelled(seq))
        return
    except DiffletError as err:
        _send(conn, msg.Error(seq, "invalid", err.message))
        return
    except Exception as err:  # a failed generation must not end the process ...
        from difflet.parallel.launch import RankError

        if isinstance(err, RankError):  # ... unless it broke a split program: be replaced
            _send(conn, msg.Error(seq, "internal", f"{err.args[0].splitlines()[0]}; the model "
                                                   "process is being replaced from the artifacts"))
            os._exit(EXIT_BROKEN_PROGRAM)
        print(f"request {fields.request_id}: generation failed", file=sys.stderr)
        traceback.print_exc()  # a bug's text goes to the server log only; the client gets the id
        _send(conn, msg.Error(seq, "internal", f"internal error in the model process (request "
                                               f"{fields.request_id}; the details are in the server log)"))
        return
    stats, p = result.stats, result.params
    _send(conn, msg.Done(seq, msg.Result(
        png=result.png, mp4=result.mp4, fps=float(result.fps),
        frames=0 if result.video is None else int(result.video.shape[0]),
        seed=p.seed, steps=p.steps, guidance=p.guidance, height=p.height, width=p.width,
        request_id=p.request_id, timings={k: float(v) for k, v in result.timings.items()},
        cache=fields.cache or default_cache,
        denoiser_calls=int(stats.get("denoiser_calls", p.steps)),
        cached_steps=int(stats.get("cached_steps", 0)), compiles=compiles[0],
        batch_rows=int(stats.get("batch_rows", 1)))))


def serve(conn, config: dict[str, Any]) -> None:
    """Process entry point: load, warm up, report, then serve Run messages until Stop or EOF."""
    os.setpgrp()  # its own process group: a kill also reaches rank workers it started
    if config.get("tmpdir"):  # the supervisor removes it after our exit, which no destructor outlives
        os.environ["TMPDIR"] = config["tmpdir"]
        tempfile.tempdir = None
    if config.get("cores"):  # its replica's cores; rank workers it starts inherit them
        os.sched_setaffinity(0, config["cores"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID` dumps stacks
    hang_on_cancel, hold, hold_steps = _faults(int(config.get("generation", 0)))
    began = time.perf_counter()
    try:
        from difflet.codegen.neuron_placement import place_process

        place_process(config)  # a neuron ART: this replica's NeuronCores, before the Neuron runtime starts
        import torch

        torch.set_num_threads(max(1, int(config.get("threads", 1))))
        compiles = _count_compiles()
        imported = time.perf_counter()
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
        _send(conn, msg.Failed(kind, str(err) if kind == "invalid" else f"{type(err).__name__}: {err}"))
        return
    _send(conn, msg.Ready(pid=os.getpid(), load_s=loaded - start, warm_up_s=warm - loaded,
                          compiles=compiles[0], import_s=imported - began))

    cancelled: set[int] = set()  # seqs asked to stop (kept small: dropped when their run ends)

    def start(run: msg.Run) -> None:
        def should_stop() -> bool:
            stop = run.seq in cancelled
            while stop and hang_on_cancel:
                time.sleep(3600)
            return stop

        def held() -> None:
            while hold_steps and os.path.exists(hold_steps) and run.seq not in cancelled:
                time.sleep(0.01)

        def body() -> None:
            try:
                _run(conn, runner, run, should_stop, compiles, config["cache"], held)
            finally:
                cancelled.discard(run.seq)

        threading.Thread(target=body, name=f"request-{run.seq}", daemon=True).start()

    while True:
        try:
            message = msg.decode_to_model(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if isinstance(message, msg.Stop):
            return
        if isinstance(message, msg.Cancel):
            cancelled.add(message.seq)
            continue
        start(message)
