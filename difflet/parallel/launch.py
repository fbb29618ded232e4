"""Run one function on N local ranks over gloo on loopback and collect what each rank returns.

For tests and benches only (the runtime has its own rank workers). Invariants:
- `run_ranks(fn, n, *args)` starts n fresh processes (forkserver start method: forked from a
  clean server that imported torch once, so no state leaks from the parent and later launches
  skip the torch import), joins them into one gloo process group through a fresh file store,
  calls `fn(rank, world, *args)` in each, and returns the n results in rank order.
- `fn` must be importable by name (a module-level function); results travel back pickled via
  torch.save, so tensors arrive as ordinary tensors in the parent.
- A failing rank raises `RankError` in the parent carrying that rank's traceback; a hang is
  bounded by `timeout` seconds, after which every child is killed. No child outlives the call.
"""
from __future__ import annotations

import io
import os
import shutil
import tempfile
import traceback
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from difflet.parallel.main_module import main_not_inherited

# torch's own pytree deprecation, raised while rank processes unpickle their arguments (torch
# 2.13; not actionable by callers): silenced in every rank process, which imports this module
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)


class RankError(RuntimeError):
    """A rank raised (message holds its traceback) or the ranks did not finish in time."""


def rendezvous() -> tuple[str, str]:
    """(init_method, directory to remove afterwards) of a fresh file store: ranks meet through a
    file, not a TCP port picked in advance, which another process starting ranks at the same
    moment could take first (two model processes loading split programs did)."""
    directory = tempfile.mkdtemp(prefix="difflet-ranks-")
    return f"file://{os.path.join(directory, 'store')}", directory


def _dumps(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _child(rank: int, world: int, init_method: str, fn, args, queue, threads: int) -> None:
    # One thread per rank: the ranks share a few cores, oversubscription only adds noise.
    torch.set_num_threads(threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        dist.init_process_group("gloo", init_method=init_method, rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))
    except BaseException:  # noqa: BLE001 - the group never formed: the parent may start it again
        queue.put((rank, False, traceback.format_exc(), "init"))
        return
    try:
        try:
            result = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        queue.put((rank, True, _dumps(result), "run"))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent, not hang it
        queue.put((rank, False, traceback.format_exc(), "run"))


def run_ranks(fn, world: int, *args, timeout: float = 120.0, threads: int = 1) -> list:
    """Call `fn(rank, world, *args)` on `world` gloo ranks; return their results in rank order.
    A group that fails to form on any rank (gloo's loopback mesh connect is known to flake under
    load, pytorch/pytorch#53270; the other ranks may already have run `fn` alone and reported) is
    started again once, all ranks, with a fresh store: `fn` must be safe to run again."""
    try:
        return _attempt(fn, world, args, timeout, threads)
    except _NotFormed:
        return _attempt(fn, world, args, timeout, threads, last=True)


class _NotFormed(Exception):
    """The process group did not form on some rank; the attempt's results are discarded."""


def _attempt(fn, world: int, args: tuple, timeout: float, threads: int, last: bool = False) -> list:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "difflet.parallel.launch"])
    queue = ctx.Queue()
    init_method, directory = rendezvous()
    procs = [ctx.Process(target=_child, args=(r, world, init_method, fn, args, queue, threads), daemon=True)
             for r in range(world)]
    with main_not_inherited():  # forkserver hands each child __main__ to import (main_module.py)
        for p in procs:
            p.start()
    results: dict[int, object] = {}
    errors: list[str] = []
    try:
        for _ in range(world):
            try:
                rank, ok, payload, stage = queue.get(timeout=timeout)
            except Exception as exc:  # queue.Empty: a rank hung or died without reporting
                raise RankError(f"{world - len(results) - len(errors)} rank(s) did not report within "
                                f"{timeout:.0f}s; exit codes {[p.exitcode for p in procs]}") from exc
            if ok:
                results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
            elif stage == "init" and not last:
                raise _NotFormed(payload)
            else:
                errors.append(f"rank {rank}:\n{payload}")
                break  # the others may now block on a collective with this rank: stop waiting
        if errors:
            raise RankError("\n".join(errors))
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(directory, ignore_errors=True)
    return [results[r] for r in range(world)]
