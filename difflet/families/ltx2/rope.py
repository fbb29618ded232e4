"""LTX-2's RoPE without float64 ops (programs.py docstring): the frequency grid is computed on
the host in float64 and handed to diffusers' float32 path by a TorchFunctionMode scoped to
the module's forward, so the tables are bit-identical to diffusers' float64 path.
"""
from __future__ import annotations

import math

import torch
from torch.overrides import TorchFunctionMode


class _HostPow(TorchFunctionMode):
    """Inside one LTX-2 RoPE forward, diffusers computes `freqs = (theta ** grid * pi / 2.0)` in
    float64; here `torch.pow(theta, grid)` returns a float32 stand-in and the following `* pi`
    returns the host's float64 result times two (exact in float32), so after diffusers' own
    `/ 2.0` the frequencies are bit-identical to diffusers' float64 path."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module, self.pending = module, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        m = self.module
        if func is torch.pow and len(args) == 2 and isinstance(args[0], (int, float)) and args[0] == m.theta \
                and isinstance(args[1], torch.Tensor) and args[1].dim() == 1:
            n = args[1].shape[0]
            if hasattr(m, f"difflet_freqs2_{n}"):
                self.pending = (getattr(m, f"difflet_pow{n}").to(args[1].device), n)
                return self.pending[0]
        if func in (torch.Tensor.__mul__, torch.Tensor.mul, torch.mul) and self.pending is not None \
                and len(args) == 2 and args[0] is self.pending[0] and args[1] == math.pi:
            n, self.pending = self.pending[1], None
            return getattr(m, f"difflet_freqs2_{n}").to(args[0].device)
        return func(*args, **(kwargs or {}))


def fp32_ltx2_rope(module: torch.nn.Module) -> bool:
    """Give an LTX-2 RoPE module diffusers' float64 frequencies without float64 ops (module
    docstring); False when it already runs without them."""
    if not module.double_precision:
        return False
    for elems in (2, 6):  # 1-D (audio, cross-attention, connectors) and 3-D (video) position grids
        n = module.dim // elems
        powers = float(module.theta) ** torch.linspace(0.0, 1.0, n, dtype=torch.float64)
        module.register_buffer(f"difflet_pow{n}", powers.to(torch.float32), persistent=False)
        # diffusers' float64 frequencies, doubled (exact) so its own `/ 2.0` gives them back
        freqs = (powers * math.pi / 2.0).to(torch.float32)
        module.register_buffer(f"difflet_freqs2_{n}", freqs * 2, persistent=False)
    module.double_precision = False
    original = module.forward

    def forward(*args, **kwargs):
        with _HostPow(module):
            return original(*args, **kwargs)

    module.forward = forward
    return True


FP32_ROPE = {"LTX2AudioVideoRotaryPosEmbed": fp32_ltx2_rope, "LTX2RotaryPosEmbed1d": fp32_ltx2_rope}
