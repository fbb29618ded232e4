"""A CFG-parallel (cfg2) denoiser: two replicas of its inner program, one per guidance pass.

`CfgProgram(node, start)` holds `start(0)` and `start(1)`: two SplitPrograms of the inner layout
(passes/cfg_branch.py `cond_view`: the same program a plan without cfg compiles; world 1
included), each in its own rank workers on its own share of the cores. A call feeds group 0 the
conditional inputs and group 1 the same inputs with the `uncond_*` twins in their place, starting
both before collecting either, so the passes overlap.

Invariants:
- Same call convention as codegen's `Program` on the cfg node: every input, twins included, in
  IR order -> (cond outputs..., uncond outputs...) in IR order (cfg-branch puts output twins
  after the originals). Combining them is the family's formula on the host (runtime/host/cfg.py).
- The groups share nothing at run time (no collective between them): each is exactly the
  inner program, so its outputs equal that program's on the same pass.
- A failure in either group raises the group's RankError (naming the global rank: group g's rank
  r is g x inner world + r) and leaves the program unusable; `close()` stops both groups.
"""
from __future__ import annotations

import threading
from typing import Callable

from difflet.ir.nodes import Node, Op
from difflet.parallel.launch import RankError


def branch_indices(node: Node, inner: Node) -> tuple[list[int], list[int]]:
    """Positions in `node`'s inputs of the inner program's inputs for the cond and uncond pass."""
    names = [n.name for n in node.find(Op.INPUT)]
    twin = {n.attrs["twin"]: n.name for n in node.find(Op.INPUT) if n.attrs.get("branch") == "uncond"}
    cond = [n.name for n in inner.find(Op.INPUT)]
    return [names.index(n) for n in cond], [names.index(twin.get(n, n)) for n in cond]


class CfgProgram:
    """Both guidance passes of a cfg2 denoiser on two inner-program replicas (module docstring)."""

    def __init__(self, node: Node, inner: Node, start: Callable[[int], object]) -> None:
        from difflet.codegen.program import Program

        self.node, self.name = node, node.name
        self.index = branch_indices(node, inner)
        self._lock = threading.Lock()
        self._broken: str | None = None
        self.groups: list = []
        try:
            for g in range(2):
                self.groups.append(start(g))
        except BaseException:
            self.close()
            raise
        self._program = Program(node, self._dispatch)
        self.inputs, self.outputs = self._program.inputs, self._program.outputs

    def _dispatch(self, *tensors):
        with self._lock:
            if self._broken:
                raise RankError(f"cfg program {self.name!r} is unusable: {self._broken}")
            try:
                for prog, idx in zip(self.groups, self.index):
                    prog.send(*(tensors[i] for i in idx))  # both passes start before either is collected
                cond, uncond = (prog.receive() for prog in self.groups)
            except RankError as err:
                self._broken = str(err).splitlines()[0]
                raise
            return tuple(cond) + tuple(uncond)

    def __call__(self, *tensors):
        return self._program(*tensors)

    def close(self) -> None:
        """Stop both groups' workers (idempotent)."""
        self._broken = self._broken or "closed"
        for prog in self.groups:
            prog.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"CfgProgram({self.name} on 2 x {self.groups[0].world if self.groups else '?'} ranks: "
                f"{[v.name for v in self.inputs]} -> {[v.name for v in self.outputs]})")
