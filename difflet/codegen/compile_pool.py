"""Concurrent compilation of the programs a codegen finds missing from the store.

Invariants:
- Workers are spawned processes (export and AOTInductor lowering hold the GIL, so threads would
  not overlap); each runs `emit.emit_program` for one program at a time, exactly what the
  parent would run, so the store entries, ART files and manifest entries are the same. The
  store's per-key locks keep concurrent producers (other codegens included) safe.
- Worker count (a backend declaring `parallel_compiles`; otherwise 1): min(usable cores, missing
  programs, available memory / the largest program's estimate), or $DIFFLET_COMPILE_WORKERS.
  With fewer than two programs or one worker the pool does nothing and the parent compiles
  in-process (no worker start-up cost).
- A failure comes back as a DiffletError naming the program; a worker that dies (e.g. killed
  for memory) is reported the same way.
- Workers never import the caller's `__main__`: a script calling the Python API without an
  `if __name__ == "__main__":` guard (as diffusers' examples are written) would otherwise run again
  in every worker and start pools inside them. The work they do lives in this module.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Iterator

from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Node
from difflet.parallel.main_module import main_not_inherited
from difflet.passes.backend_facts import backend_facts

WORKERS_ENV = "DIFFLET_COMPILE_WORKERS"
# A compile worker's resident memory besides the program's weights: torch, inductor and g++
# (measured about 1.2 GiB peak for a tiny denoiser program; 2 GiB leaves room for larger graphs).
WORKER_BASE_BYTES = 2 << 30
WEIGHT_COPIES = 4  # the module, export's constants, the safetensors write, inductor's view


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62  # unknown: cores and programs bound the count


def estimate_bytes(node: Node) -> int:
    from difflet.passes.model_facts import dtype_bytes

    params = int(node.attrs.get("params") or 0)
    return WORKER_BASE_BYTES + WEIGHT_COPIES * params * dtype_bytes(node.attrs.get("dtype", "float32"))


def compile_workers(nodes: list[Node]) -> int:
    """How many programs to compile at once (module invariants)."""
    if os.environ.get(WORKERS_ENV):
        try:
            wanted = int(os.environ[WORKERS_ENV])
        except ValueError:
            wanted = 0
        if wanted < 1:
            raise DiffletError(f"must be a positive integer, got {os.environ[WORKERS_ENV]!r}", where=WORKERS_ENV)
        return min(wanted, max(1, len(nodes)))
    if not nodes:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    by_memory = _mem_available() // max(estimate_bytes(n) for n in nodes)
    return max(1, min(cores, len(nodes), by_memory))


def _init_worker() -> None:
    # one program per worker process: inductor's own compile subprocess pool would only add start-up
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"


def _compile_one(module: Module, name: str, ckpt: str, store_root: str, backend: str, out: str,
                 verbose: bool):
    """Worker body: (True, (entry, created, seconds)) or (False, error text)."""
    from difflet.codegen.emit import emit_program
    from difflet.codegen.quiet import quiet_libraries
    from difflet.codegen.store import Store

    start = time.perf_counter()
    try:
        with quiet_libraries(verbose):
            entry, created = emit_program(module, name, Path(ckpt), Store(store_root), backend, Path(out))
        return True, (entry, created, time.perf_counter() - start)
    except DiffletError as err:
        return False, str(err)
    except Exception as err:  # any compiler failure: its type and message, with the program named by the parent
        return False, f"{type(err).__name__}: {err}"


class CompilePool:
    """`with CompilePool(...) as pool`: `node in pool` if a worker compiles it; `pool.results()`
    yields (node, manifest entry, created, seconds) as each finishes."""

    def __init__(self, module: Module, missing: list[Node], ckpt: Path, store_root: Path, backend: str,
                 out: Path, verbose: bool) -> None:
        workers = compile_workers(missing) if backend_facts(backend).parallel_compiles else 1
        self.workers = workers
        self.nodes = list(missing) if len(missing) > 1 and workers > 1 else []
        self._args = (module, str(ckpt), str(store_root), backend, str(out), verbose)
        self._executor: ProcessPoolExecutor | None = None
        self._futures: dict[Future, Node] = {}

    def __contains__(self, node: Node) -> bool:
        return any(n.name == node.name for n in self.nodes)

    def __enter__(self) -> "CompilePool":
        if self.nodes:
            import multiprocessing

            self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_init_worker)
            module, ckpt, store_root, backend, out, verbose = self._args
            with main_not_inherited():  # spawn starts the workers inside submit (concurrent/futures/process.py)
                for node in self.nodes:
                    fut = self._executor.submit(_compile_one, module, node.name, ckpt, store_root, backend, out,
                                                verbose)
                    self._futures[fut] = node
        return self

    def results(self) -> Iterator[tuple[Node, object, bool, float]]:
        for fut in as_completed(self._futures):
            node = self._futures[fut]
            try:
                ok, payload = fut.result()
            except Exception as err:  # BrokenProcessPool: the worker died (killed for memory, a crash)
                raise DiffletError(f"the compile worker of {node.name!r} died ({type(err).__name__}: {err}); "
                                   f"retry with {WORKERS_ENV}=1", where=node.loc) from None
            if not ok:
                raise DiffletError(f"compiling {node.name!r} failed: {payload}", where=node.loc)
            yield (node, *payload)

    def __exit__(self, *exc) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
