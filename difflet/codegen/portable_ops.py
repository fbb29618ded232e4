"""Ops rewritten, value for value, into forms every backend lowers: installed on each program module.

torch-xla (the path torch-neuronx traces through) lowers a few ops that the model classes use
in ways a Neuron program cannot hold (measured on torch-xla 2.9's CPU device, bench/xla_check.py):
- nearest upsampling: `upsample_nearest2d` carries its scale as a float64 constant, and
  `_upsample_nearest_exact2d` / `upsample_nearest3d` have no lowering (a CPU fallback cuts the
  graph into several programs). By a power-of-two factor both modes pick source index
  floor(dst / f) exactly, so they become expand + reshape: the same values, copied.
- a float tensor compared with or masked-filled by a Python float, and leaky_relu's slope:
  torch-xla makes the scalar a float64 parameter and compares or converts in float64. The scalar
  becomes a 0-d tensor of the tensor's dtype where eager torch uses it in that dtype anyway (a
  fill value always; a compared value in float32, or when the dtype represents it exactly);
  leaky_relu becomes where(x > 0, x, x * slope), the eager kernel's own formula.
- `x[..., -n:]` with n above that dim's size: eager torch clamps the start to 0, torch-xla's
  slice refuses it ("Value out of range"); the start is clamped here (Wan's decoder takes the
  last 2 frames of 1-frame chunks).

Invariant: every rewrite gives bit-identical results in eager torch (the oracle tests compare the
programs with the unmodified classes); anything else passes through untouched.
"""
from __future__ import annotations

import struct

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_MASKED_FILL = {torch.Tensor.masked_fill, torch.masked_fill}
# `a >= b` reaches a mode as Tensor.ge; the dunders and torch.ge are other entry points
_COMPARE = {f for n in ("ge", "gt", "le", "lt", "eq", "ne")
            for f in (getattr(torch.Tensor, n), getattr(torch.Tensor, f"__{n}__"), getattr(torch, n))}


def _exact(value: float, dtype: torch.dtype) -> bool:
    """Whether `value` is representable in the float `dtype` (then comparing in it changes nothing)."""
    try:
        f32 = struct.unpack("f", struct.pack("f", value))[0]
        half = struct.unpack("e", struct.pack("e", value))[0] if dtype == torch.float16 else value
    except (OverflowError, struct.error):
        return False
    if dtype == torch.bfloat16:  # the upper half of a float32
        return f32 == value and struct.unpack("I", struct.pack("f", value))[0] & 0xFFFF == 0
    return {torch.float32: f32 == value, torch.float16: half == value, torch.float64: True}.get(dtype, False)


def _compares_in_dtype(value: float, dtype: torch.dtype) -> bool:
    """Whether eager torch compares a `dtype` tensor with `value` cast to `dtype`: always for
    float32 (its own compute type), and for any dtype that represents `value` exactly."""
    return dtype == torch.float32 or _exact(value, dtype)


def _interpolate_args(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                      recompute_scale_factor=None, antialias=False):
    return input, size, scale_factor, mode, align_corners, antialias


def _power_of_two_factors(x: torch.Tensor, size, scale_factor) -> list[int] | None:
    spatial = list(x.shape[2:])
    if scale_factor is not None:
        scales = list(scale_factor) if isinstance(scale_factor, (tuple, list)) else [scale_factor] * len(spatial)
        factors = [int(s) if float(s).is_integer() else 0 for s in scales]
    elif size is not None:
        sizes = list(size) if isinstance(size, (tuple, list)) else [size] * len(spatial)
        factors = [o // i if i and o % i == 0 else 0 for o, i in zip(sizes, spatial)]
    else:
        return None
    ok = len(factors) == len(spatial) and all(f >= 1 and f & (f - 1) == 0 for f in factors)
    return factors if ok else None


def nearest_upsample(x: torch.Tensor, factors: list[int]) -> torch.Tensor:
    """Nearest upsampling of x [N, C, *spatial] by integer `factors`, as expand + reshape."""
    n, c, spatial = x.shape[0], x.shape[1], list(x.shape[2:])
    inter = [n, c] + [d for s in spatial for d in (s, 1)]
    wide = [n, c] + [d for s, f in zip(spatial, factors) for d in (s, f)]
    return x.reshape(inter).expand(wide).reshape([n, c] + [s * f for s, f in zip(spatial, factors)])


class PortableOps(TorchFunctionMode):
    """The rewrites of the module docstring, for the ops called while the mode is active."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.interpolate:
            x, size, scale, mode, align, antialias = _interpolate_args(*args, **kwargs)
            factors = _power_of_two_factors(x, size, scale) if mode in ("nearest", "nearest-exact") \
                and not antialias and align is None else None
            if factors is not None:
                return nearest_upsample(x, factors)
        elif func in _COMPARE and len(args) == 2 and isinstance(args[1], float) \
                and isinstance(args[0], torch.Tensor) and _compares_in_dtype(args[1], args[0].dtype):
            x = args[0]
            args = (x, torch.full((), args[1], dtype=x.dtype, device=x.device))
        elif func in _MASKED_FILL and len(args) == 3 and isinstance(args[2], float) \
                and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
            x = args[0]  # the fill value is cast to x's dtype either way
            args = (x, args[1], torch.full((), args[2], dtype=x.dtype, device=x.device))
        elif func is F.leaky_relu and isinstance(args[0], torch.Tensor) and not kwargs.get("inplace", False) \
                and (len(args) < 3 or not args[2]):
            x, slope = args[0], args[1] if len(args) > 1 else kwargs.get("negative_slope", 0.01)
            return torch.where(x > 0, x, x * float(slope))  # eager multiplies by the float slope too
        elif func is torch.Tensor.__getitem__ and isinstance(args[1], tuple) \
                and all(isinstance(i, (slice, int)) for i in args[1]):
            x, index = args
            args = (x, tuple(slice(None, i.stop, i.step) if isinstance(i, slice) and isinstance(i.start, int)
                             and i.start < -x.shape[d] else i for d, i in enumerate(index)))
        return func(*args, **kwargs)


def install_portable_ops(pm: torch.nn.Module) -> torch.nn.Module:
    """Run `pm`'s forward under PortableOps (hooks: its state-dict keys stay unchanged)."""
    mode = PortableOps()

    def enter(module, args) -> None:  # a pre-hook's return value would replace the inputs
        mode.__enter__()

    def leave(module, args, out) -> None:
        mode.__exit__(None, None, None)

    pm.register_forward_pre_hook(enter)
    pm.register_forward_hook(leave, always_call=True)
    return pm
