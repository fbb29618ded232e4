"""Call a compiled program by its IR signature: named host values in, named outputs out.

Invariants:
- Positional order, shapes and dtypes come from the component's `input`/`output` nodes, never
  from the caller; a tensor of the wrong shape is a host bug and raises before the program runs.
- A runtime input (`RuntimeType`) crosses as a 0-d int64 tensor and must lie in its `[lo, hi]`.
- Float tensors are cast to the program's declared dtype (the host computes in float32).
- With a `reuse` memo, a cast is reused while the caller passes the very same, unmodified tensor
  object again (a request's text embeddings on every step): identity via weakref, unmodified via
  the version counter (inference tensors cannot be modified outside inference mode). A cast is
  kept only from an input's second call with that tensor on, so one-off inputs (latents, a VAE's
  chunk caches) never hold a copy between calls.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Mapping

import torch

from difflet.ir.nodes import Node, Op, RuntimeType, TensorType

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unsupported tensor dtype {name!r}") from None


def runtime_scalar(value: int, rtype: RuntimeType, name: str) -> torch.Tensor:
    """A runtime value as the 0-d tensor a program takes, checked against its supported range."""
    value = int(value)
    if not rtype.lo <= value <= rtype.hi:
        raise ValueError(f"runtime value {name}={value} outside the compiled range "
                         f"[{rtype.lo}, {rtype.hi}]")
    return torch.tensor(value, dtype=torch_dtype(rtype.dtype))


def bind_inputs(component: Node, values: Mapping[str, Any], reuse: dict | None = None) -> tuple[torch.Tensor, ...]:
    """The program's positional arguments from `values` keyed by IR input name; `reuse` (one dict
    per component, owned by the caller's lock) keeps casts of unchanged tensors across calls."""
    inputs = component.find(Op.INPUT)
    missing = [n.name for n in inputs if n.name not in values]
    extra = sorted(set(values) - {n.name for n in inputs})
    if missing or extra:
        raise ValueError(f"program {component.name!r}: missing inputs {missing}, unknown {extra}")
    args = []
    for node in inputs:
        declared = node.results[0].type
        value = values[node.name]
        if isinstance(declared, RuntimeType):
            args.append(runtime_scalar(value, declared, node.name))
            continue
        tensor = torch.as_tensor(value)
        if tuple(tensor.shape) != tuple(declared.shape):
            raise ValueError(f"program {component.name!r} input {node.name!r}: shape "
                             f"{tuple(tensor.shape)} != compiled {tuple(declared.shape)}")
        args.append(_cast(tensor, torch_dtype(declared.dtype), reuse, node.name))
    return tuple(args)


def _cast(tensor: torch.Tensor, dtype: torch.dtype, reuse: dict | None, name: str) -> torch.Tensor:
    """`tensor` as a contiguous `dtype` tensor; through `reuse[name]`: (weakref, version, cast or
    None until the same tensor comes a second time)."""
    if reuse is None:
        return tensor.to(dtype).contiguous()
    version = None if tensor.is_inference() else tensor._version
    seen = reuse.get(name)
    if seen is not None and seen[0]() is tensor and seen[1] == version:
        if seen[2] is None:
            reuse[name] = (seen[0], version, tensor.to(dtype).contiguous())
        return reuse[name][2]
    cast = tensor.to(dtype).contiguous()
    # a tensor already in the program's dtype is passed through: nothing to keep
    reuse[name] = (weakref.ref(tensor), version, None) if cast is not tensor else None
    return cast


def invoke(component: Node, program: Callable, values: Mapping[str, Any],
           reuse: dict | None = None) -> dict[str, torch.Tensor]:
    """Run `program` on `values`; returns its outputs by IR output name (cast back to float32)."""
    outputs = component.find(Op.OUTPUT)
    with torch.inference_mode():
        result = program(*bind_inputs(component, values, reuse))
    if isinstance(result, torch.Tensor):
        result = (result,)
    if len(result) != len(outputs):
        raise ValueError(f"program {component.name!r} returned {len(result)} outputs, "
                         f"the IR declares {len(outputs)}")
    named = {}
    for node, tensor in zip(outputs, result):
        declared: TensorType = node.results[0].type
        if tuple(tensor.shape) != tuple(declared.shape):
            raise ValueError(f"program {component.name!r} output {node.name!r}: shape "
                             f"{tuple(tensor.shape)} != declared {tuple(declared.shape)}")
        named[node.name] = tensor.float() if tensor.is_floating_point() else tensor
    return named
