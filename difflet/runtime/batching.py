"""Batching: concurrent requests of one size join their denoiser calls into one program call.

A description whose profile has `batch` and was lowered with `--batch-sizes 1,2,4` has, per
size, programs at each batch size for the components whose shapes use `batch` (the denoiser);
everything else (encoders, VAE, probe) runs per request. A model process runs up to
`max_batch` requests at once, each on its own thread through the unchanged host steps; their
calls of a batched component meet here.

Invariants:
- Members are the requests of one size that are inside a denoise-phase step. A call waits until
  every member has a call pending (or has left); then the pending calls run, grouped by
  component and by equal shared inputs, each group in chunks of the largest compiled batch size
  that fits (no padding rows), and each caller gets exactly its own rows back. So a request
  never waits for one still encoding or decoding, and one that leaves (done, cancelled, failed)
  releases the others at once.
- Per-row inputs/outputs are those whose leading dimension is `batch` (1 at batch size 1, B at
  B); every other input (RoPE ids, the valid-text count) is shared and must be equal within a
  call, so requests that differ there run in separate calls, never with a wrong value.
- Rows are independent in the programs (no op mixes samples), so a request's result does not
  depend on its batch mates beyond the kernels' batch-size-dependent rounding.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from difflet.ir.nodes import Node, Op, TensorType
from difflet.runtime.invoke import invoke


@dataclass
class _Call:
    component: str
    values: dict[str, Any]
    done: bool = False
    result: dict[str, torch.Tensor] | None = None
    error: BaseException | None = None
    rows: int = 1  # how many requests the program call that served it had


@dataclass
class Variant:
    """One compiled batch size of a batched component."""

    node: Node
    program: Callable
    lock: threading.Lock = field(default_factory=threading.Lock)


def per_row_names(one: Node, many: Node) -> set[str]:
    """Names of the inputs and outputs whose leading dim differs between batch 1 and batch B."""
    def shapes(node: Node) -> dict[str, tuple]:
        return {n.name: tuple(n.results[0].type.shape) for n in (*node.find(Op.INPUT), *node.find(Op.OUTPUT))
                if isinstance(n.results[0].type, TensorType)}
    a, b = shapes(one), shapes(many)
    return {k for k in a if a[k][:1] == (1,) and b[k][:1] != (1,) and a[k][1:] == b[k][1:]}


class BatchGate:
    """Joins the denoise-phase calls of one size's batched components (see module invariants)."""

    def __init__(self, variants: dict[str, dict[int, Variant]]) -> None:
        self.variants = variants  # component -> batch size -> Variant; batch 1 always present
        self._rows = {c: per_row_names(v[1].node, v[max(v)].node) for c, v in variants.items()}
        self._cond = threading.Condition()
        self._members = 0
        self._pending: list[_Call] = []
        self._local = threading.local()
        self.calls_by_rows: dict[int, int] = {}  # program calls by row count (for tests/bench)
        self.record: dict[str, dict] | None = None  # warm-up: last call's values per component

    @contextmanager
    def member(self):
        """The calling thread's request is in a denoise-phase step for the duration."""
        with self._cond:
            self._members += 1
        self._local.member, self._local.max_rows = True, getattr(self._local, "max_rows", 1)
        try:
            yield
        finally:
            self._local.member = False
            with self._cond:
                self._members -= 1
                ready = self._take()
            self._execute(ready)

    def batched(self, component: str) -> bool:
        return component in self.variants and getattr(self._local, "member", False)

    def take_max_rows(self) -> int:
        """The largest row count of any call this thread's request took part in; resets it."""
        rows, self._local.max_rows = getattr(self._local, "max_rows", 1), 1
        return rows

    def call(self, component: str, values: dict[str, Any]) -> dict[str, torch.Tensor]:
        call = _Call(component, dict(values))
        if self.record is not None:
            self.record[component] = call.values
        with self._cond:
            self._pending.append(call)
            ready = self._take()
            self._cond.notify_all()  # `wait_pending` watchers
        self._execute(ready)
        with self._cond:
            while not call.done:
                self._cond.wait()
        if call.error is not None:
            raise call.error
        self._local.max_rows = max(self._local.max_rows, call.rows)
        return call.result

    def wait_pending(self, n: int, timeout: float | None = None) -> bool:
        """Block until `n` calls are pending (True) or `timeout` passes (False): lets a holder
        that entered `member()` without calling release a known batch (tests)."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._pending) >= n, timeout)

    def _take(self) -> list[_Call]:
        """(lock held) The pending calls, once every member has one pending."""
        if self._pending and len(self._pending) >= self._members:
            ready, self._pending = self._pending, []
            return ready
        return []

    def _execute(self, calls: list[_Call]) -> None:
        if not calls:
            return
        try:
            for group in self._groups(calls):
                self._run_group(group)
        finally:
            with self._cond:
                for c in calls:
                    if not c.done:
                        c.done, c.error = True, c.error or RuntimeError("batched call did not run")
                self._cond.notify_all()

    def _groups(self, calls: list[_Call]) -> list[list[_Call]]:
        """Calls of one component whose shared inputs are equal, in arrival order."""
        groups: list[list[_Call]] = []
        for c in calls:
            shared = [k for k in c.values if k not in self._rows[c.component]]
            for g in groups:
                head = g[0]
                if head.component == c.component and all(_same(head.values[k], c.values[k]) for k in shared):
                    g.append(c)
                    break
            else:
                groups.append([c])
        return groups

    def run_rows(self, component: str, calls: list[dict[str, Any]]) -> list[dict[str, torch.Tensor]]:
        """One program call of the compiled batch size len(calls): per-row inputs concatenated,
        shared ones taken from the first call; each call's own rows of the outputs back."""
        variant, rows = self.variants[component][len(calls)], self._rows[component]
        values = {k: (torch.cat([torch.as_tensor(c[k]) for c in calls]) if k in rows else v)
                  for k, v in calls[0].items()}
        with variant.lock:
            out = invoke(variant.node, variant.program, values)
        return [{k: (t[i:i + 1] if k in rows else t) for k, t in out.items()} for i in range(len(calls))]

    def _run_group(self, group: list[_Call]) -> None:
        sizes = sorted(self.variants[group[0].component], reverse=True)
        while group:
            size = next(s for s in sizes if s <= len(group))
            chunk, group = group[:size], group[size:]
            try:
                results = self.run_rows(chunk[0].component, [c.values for c in chunk])
            except BaseException as err:  # every caller of the chunk sees the program's error
                for c in chunk:
                    c.error, c.done = err, True
                continue
            self.calls_by_rows[size] = self.calls_by_rows.get(size, 0) + 1
            for c, result in zip(chunk, results):
                c.result, c.rows, c.done = result, size, True


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        a, b = torch.as_tensor(a), torch.as_tensor(b)
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    return a == b
