"""The front-blocks pass: mark the denoiser to be cut into block mode's front and rest programs.

Invariants:
- `--front-blocks K` (K >= 1) sets attrs `front_blocks = K` on every denoiser component; K = 0
  (the default) leaves the module unchanged. The attr is part of the component's cache key, so
  a cut denoiser never reuses the whole one's program (nor one cut elsewhere).
- Anything codegen would refuse (difflet/passes/built.py `blocks_reason`: class, backend, split
  layout, shape buckets) is refused here first, naming the option, and so is a K at or above the
  lowered `num_blocks` (every block list the class holds: an upper bound of the cut's stacks);
  the exact count of the family's declared stacks needs the model, so codegen checks it
  (codegen/blocks.py).
"""
from __future__ import annotations

import msgspec

from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Op
from difflet.passes.built import blocks_reason

OPTION = "--front-blocks"


def cut_front(module: Module, k: int, backend: str) -> Module:
    if k == 0:
        return module
    if k < 0:
        raise DiffletError(f"{OPTION} must be >= 0 (0: the whole denoiser), got {k}", where=OPTION)
    body, cut = [], 0
    for n in module.body:
        if n.op == Op.COMPONENT and n.attrs.get("role") == "denoiser":
            n = msgspec.structs.replace(n, attrs=n.attrs.set(front_blocks=k))
            total = n.attrs.get("num_blocks")
            if total is not None and k >= int(total):
                raise DiffletError(f"{OPTION} {k}: the denoiser {n.name} has at most {total} blocks, and the "
                                   "rest needs at least one", where=OPTION)
            reason = blocks_reason(n, backend)
            if reason:
                raise DiffletError(f"{OPTION} {k}: {reason} (component {n.name})", where=OPTION)
            cut += 1
        body.append(n)
    if not cut:
        raise DiffletError(f"{OPTION} {k}: the module has no denoiser component", where=OPTION)
    return msgspec.structs.replace(module, body=tuple(body))
