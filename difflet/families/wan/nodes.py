"""Wan host steps' reads of the IR: a component's input types, the (first) denoiser, the VAE's
temporal scale. Shapes come from the IR, never from a diffusers config (host.py's invariant)."""
from __future__ import annotations

from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op
from difflet.runtime.host.env import HostEnv


def input_type(component: Node, name: str):
    """The IR type of the component's input `name` (an error naming the component when absent)."""
    for node in component.find(Op.INPUT, name):
        return node.results[0].type
    raise DiffletError(f"component {component.name!r} has no input {name!r}", where=component.loc)


def transformer(env: HostEnv) -> Node:
    """The (first) denoiser: Wan 2.2 A14B's two experts take and give the same shapes and dtypes,
    and WanPipeline reads the first's config for them as well."""
    denoisers = env.module.components("denoiser")
    if len(denoisers) not in (1, 2):
        raise DiffletError(f"wan needs one denoiser (two: Wan 2.2's experts), the module has {len(denoisers)}",
                           where="schedule")
    return denoisers[0]


def temporal_scale(env: HostEnv) -> int:
    """Video frames per later latent frame: the chunk decoder's (outputs sample, next_cache0, ...)
    `sample` frames; 4, Wan 2.1's, for a decoder that is not chunked."""
    for vae in env.module.components("decoder"):
        outputs = vae.find(Op.OUTPUT)
        if [o.name for o in outputs[:2]] == ["sample", "next_cache0"]:
            return int(outputs[0].results[0].type.shape[2])
    return 4
