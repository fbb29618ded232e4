"""Float64-free rotary position embeddings, installed on every component program before export.

Neuron cores have no FP64 (AWS Neuron SDK 2.2x architecture docs: NeuronCore-v3 data types are
FP32/TF32/BF16/FP16/FP8 and integers), but diffusers computes some RoPE tables in float64 on CPU, which puts f64
ops into every traced denoiser graph (`difflet check --target trn2` names them). Fixes by family:

- FLUX (`FluxPosEmbed`, diffusers 0.42 `transformer_flux.py`): the positions are program inputs
  (img_ids, txt_ids), so the table cannot be a constant. The inverse frequencies, which depend
  only on theta and the axis widths, are computed on the host in float64 (diffusers' own values)
  and kept as a float32 buffer; the angle `pos * inv_freq` and its cos/sin run in float32 (what
  diffusers itself does on MPS/NPU, where `maybe_adjust_dtype_for_device` drops to float32).
- LTX-2 (`LTX2AudioVideoRotaryPosEmbed`, `LTX2RotaryPosEmbed1d`): the only float64 value is the
  frequency grid `theta ** linspace(0, 1, n)`, a constant. It is computed on the host in float64
  and kept as float32 buffers (one per grid length the module can ask for); the module runs with
  diffusers' `double_precision=False` and a TorchFunctionMode scoped to its forward hands it the
  host values (`_HostPow`), so its tables are bit-identical to diffusers' float64 path (a float32
  `pow` would be ~4 ulp off, enough to flip uint8 pixels of the decoded video).
- Qwen-Image (precomputed complex64 buffers, codegen/family/qwen_image.py), Wan (float32 buffers
  built at construction) and HunyuanVideo (float32 `get_1d_rotary_pos_embed`) export without f64.

Invariant: `install_fp32_rope(model)` only replaces how a table is computed, never which table:
tests/test_neuron_rope.py compares each replaced module with diffusers' float64 result.
"""
from __future__ import annotations

import math

import torch
from torch.overrides import TorchFunctionMode


class Fp32FluxRope(torch.nn.Module):
    """FluxPosEmbed's (cos, sin) tables [S, sum(axes_dim)] from ids [S, n_axes], in float32 only."""

    def __init__(self, theta: float, axes_dim: list[int]) -> None:
        super().__init__()
        self.axes_dim = [int(d) for d in axes_dim]
        inv = [1.0 / (float(theta) ** (torch.arange(0, d, 2, dtype=torch.float64) / d)) for d in self.axes_dim]
        # one float32 row per axis, concatenated; computed once on the host in float64
        self.register_buffer("inv_freq", torch.cat(inv).to(torch.float32), persistent=False)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos, inv = ids.float(), self.inv_freq.to(ids.device)
        start, angles = 0, []
        for i, d in enumerate(self.axes_dim):
            angles.append(torch.outer(pos[:, i], inv[start:start + d // 2]))  # float32 [S, d/2]
            start += d // 2
        a = torch.cat(angles, dim=-1)
        return a.cos().repeat_interleave(2, dim=1), a.sin().repeat_interleave(2, dim=1)


def _replace_flux(module: torch.nn.Module) -> None:
    fp32 = Fp32FluxRope(module.theta, list(module.axes_dim))
    module.add_module("difflet_fp32", fp32)
    module.forward = fp32.forward


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


def _replace_ltx2(module: torch.nn.Module) -> None:
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


def install_fp32_rope(model: torch.nn.Module) -> int:
    """Replace float64 RoPE computations in `model` (module docstring); returns how many."""
    count = 0
    for module in model.modules():
        name = type(module).__name__
        if name == "FluxPosEmbed" and not hasattr(module, "difflet_fp32"):
            _replace_flux(module)
            count += 1
        elif name in ("LTX2AudioVideoRotaryPosEmbed", "LTX2RotaryPosEmbed1d") and module.double_precision:
            _replace_ltx2(module)
            count += 1
    return count
