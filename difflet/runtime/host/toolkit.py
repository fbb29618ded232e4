"""What every family's host steps share: IR shape queries, config values, schedulers, the
resolution shift, 2x2 latent packing and the guidance reading.

Invariants:
- Shapes come from the IR (program input/output types), never from a diffusers config, so the
  host and the compiled programs cannot disagree.
- Names no family: a family's host.py imports this, never another family's host.py.
"""
from __future__ import annotations

import inspect

import torch

from difflet.errors import DiffletError
from difflet.families.facts import FamilyFacts, find_step, guidance_spec
from difflet.frontend.classes import resolve_class
from difflet.ir.nodes import Node, Op


def io_shape(component: Node, io: Op, index: int = 0) -> tuple[int, ...]:
    """The shape of the component's `index`-th input (io=Op.INPUT) or output (Op.OUTPUT)."""
    return tuple(component.find(io)[index].results[0].type.shape)


def input_shape(component: Node, name: str) -> tuple[int, ...]:
    """The shape of the component's input `name` (a clear error naming it when absent)."""
    for node in component.find(Op.INPUT, name):
        return tuple(node.results[0].type.shape)
    raise DiffletError(f"component {component.name!r} has no input {name!r}", where=component.loc)


def class_config_value(component: Node, key: str):
    """A config value of a component: the IR's inline config, else the class's default."""
    config = component.attrs.get("config")
    if config is not None and key in config:
        return config[key]
    cls = resolve_class(component.attrs["class"])
    param = inspect.signature(cls.__init__).parameters.get(key)
    if param is None or param.default is inspect.Parameter.empty:
        raise DiffletError(f"component {component.name!r}: config has no {key!r} and "
                           f"{cls.__name__} has no default for it", where=component.loc)
    return param.default


def make_scheduler(step: Node):
    """A fresh scheduler instance for one request, from the step's static attrs."""
    spec = step.attrs["scheduler"]
    cls = resolve_class(spec["class"])
    return cls.from_config(spec["config"].to_python())


def calculate_shift(image_seq_len: int, base_seq_len: int = 256, max_seq_len: int = 4096,
                    base_shift: float = 0.5, max_shift: float = 1.15) -> float:
    """The flow-matching pipelines' resolution shift mu (diffusers' calculate_shift)."""
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * m + (base_shift - m * base_seq_len)


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, (H/2)(W/2), 4C]: 2x2 patches become tokens."""
    b, c, h, w = latents.shape
    latents = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return latents.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Inverse of `pack_latents` for latent height/width (already divided by vae_scale_factor)."""
    b, _, channels = latents.shape
    latents = latents.view(b, height // 2, width // 2, channels // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return latents.reshape(b, channels // 4, height, width)


def vae_scale(module, profile) -> int:
    """The VAE's spatial compression: profile height / the decoder input's latent height (axis -2)."""
    return int(profile["height"]) // io_shape(module.components("decoder")[0], Op.INPUT)[-2]


def packed_latent_geometry(module, profile, height: int, width: int) -> tuple[int, int, int]:
    """(latent channels, latent height, latent width) of a 2x2-packed image denoiser, as the
    pipelines' prepare_latents compute them: channels = hidden_states width / 4, the VAE scale
    factor = profile height / the VAE input's latent height (axis -2, so a frame axis is fine)."""
    vae_scale_factor = vae_scale(module, profile)
    channels = input_shape(module.components("denoiser")[0], "hidden_states")[-1] // 4
    return (channels, 2 * (int(height) // (vae_scale_factor * 2)),
            2 * (int(width) // (vae_scale_factor * 2)))


def guidance(step: Node, facts: FamilyFacts, modes: tuple[str, ...]) -> dict:
    """The step's guidance spec (families/facts.py `guidance_spec`, the family's default mode),
    refused naming the step when its mode is not one of `modes`."""
    spec = guidance_spec(step, facts.default_guidance)
    if spec["mode"] not in modes:
        names = " and ".join(repr(m) for m in modes)
        raise DiffletError(f"{step.name} supports guidance mode{'s' if len(modes) > 1 else ''} {names}, "
                           f"not {spec['mode']!r}", where=step.loc)
    return spec


def schedule_step(module, name: str) -> Node:
    """The schedule's step `name` (a clear error when the schedule has none)."""
    step = find_step(module, name)
    if step is None:
        raise DiffletError(f"the schedule has no {name} step", where="schedule")
    return step
