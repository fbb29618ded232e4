"""Load WanTransformer3DModel without `accelerate`, with diffusers' own dtype rules.

diffusers (0.42) refuses `WanTransformer3DModel.from_pretrained` when accelerate is missing: the
class keeps some modules in fp32 (`_keep_in_fp32_modules`) and that path needs
low_cpu_mem_usage, which needs accelerate. Difflet's environment does not ship accelerate, so
`install()` gives the class a from_pretrained that builds it from its config and assigns the
checkpoint's tensors, cast as diffusers casts them: floating tensors whose dotted name contains
a keep-in-fp32 module name stay fp32, the others take `torch_dtype`; non-persistent buffers
(RoPE tables) keep their constructed dtype.

Invariants:
- Inert when accelerate is installed (the library's own loader runs) and for any argument this
  loader does not handle (variants, device maps, quantization, hub ids): those go to the original.
- Loads strictly: a missing or unexpected tensor is an error, as in diffusers.
"""
from __future__ import annotations

import json
from pathlib import Path

_HANDLED = {"subfolder", "torch_dtype"}
# what DiffusionPipeline.from_pretrained passes along that changes nothing for a local directory
_NEUTRAL = {"low_cpu_mem_usage", "use_safetensors", "offload_state_dict"}


def _state_dict(directory: Path) -> dict:
    from safetensors.torch import load_file

    index = directory / "diffusion_pytorch_model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() \
        else ["diffusion_pytorch_model.safetensors"]
    state: dict = {}
    for name in files:
        state.update(load_file(str(directory / name)))
    return state


def load(cls, directory: Path, torch_dtype=None):
    """`cls` from `directory` (config.json + safetensors) in diffusers' dtype layout, eval mode."""
    import torch

    model = cls.from_config(cls.load_config(str(directory)))
    keep = cls._keep_in_fp32_modules or []
    state = _state_dict(directory)
    for name, tensor in state.items():
        if torch_dtype is not None and torch.is_floating_point(tensor):
            fp32 = any(k in name.split(".") for k in keep)
            state[name] = tensor.to(torch.float32 if fp32 else torch_dtype)
    model.load_state_dict(state, strict=True, assign=True)
    model.register_to_config(_name_or_path=str(directory))
    return model.eval()


def install() -> None:
    """Give WanTransformer3DModel the accelerate-free loader when accelerate is missing (idempotent)."""
    from diffusers import WanTransformer3DModel
    from diffusers.utils import is_accelerate_available

    if is_accelerate_available() or getattr(WanTransformer3DModel.from_pretrained, "difflet", False):
        return
    original = WanTransformer3DModel.from_pretrained.__func__

    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        directory = Path(pretrained_model_name_or_path) / (kwargs.get("subfolder") or "")
        other = {k for k, v in kwargs.items() if k not in _HANDLED | _NEUTRAL and v not in (None, False)}
        if other or not (directory / "config.json").is_file():
            return original(cls, pretrained_model_name_or_path, **kwargs)
        return load(cls, directory, kwargs.get("torch_dtype"))

    from_pretrained.difflet = True
    WanTransformer3DModel.from_pretrained = classmethod(from_pretrained)
