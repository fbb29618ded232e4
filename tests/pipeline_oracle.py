"""The diffusers pipeline of each tiny family, called as its model card says, on the random:0
checkpoint Difflet serves: the oracle that served layouts (split, cfg2, batch, buckets) are held to
directly, not through Difflet's own TP1 output.

No Difflet code runs on this side except planning the description (for its profile defaults and the
checkpoint's store key): the pipeline class loads the saved directory and runs its own loop.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from conftest import REPO

PIPELINES = {"flux": "FluxPipeline", "qwen_image": "QwenImagePipeline", "wan": "WanPipeline",
             "hunyuan_video": "HunyuanVideoPipeline", "ltx2": "LTX2Pipeline"}


@lru_cache(maxsize=None)
def _planned(model: str):
    from oracle_util import planned_tiny, random_checkpoint

    module = planned_tiny(REPO / "models" / f"{model}.dsl")
    return module, random_checkpoint(module)


@lru_cache(maxsize=2)  # a tiny pipeline is a few MB; two cover a test file's models
def _pipe(model: str):
    import diffusers

    module, ckpt = _planned(model)
    pipe = getattr(diffusers, PIPELINES[module.attrs["family"]]).from_pretrained(str(ckpt))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def checkpoint(model: str):
    """The random:0 checkpoint directory Difflet compiles and serves `model` from."""
    return _planned(model)[1]


def pipeline_output(model: str, prompt: str, seed: int, *, steps: int | None = None,
                    guidance: float | None = None, negative_prompt: str | None = None,
                    height: int | None = None, width: int | None = None, frames: int | None = None) -> np.ndarray:
    """uint8 [H, W, 3] (image families) or [F, H, W, 3] (video families): the family's diffusers
    pipeline on `model`'s checkpoint; unset arguments take the description's profile defaults and
    Difflet's default negative prompt for that family (QwenImage " ", others the pipeline's)."""
    module, _ = _planned(model)
    profile, family = module.attrs["profile"].to_python(), module.attrs["family"]
    steps = profile["steps"] if steps is None else steps
    guidance = profile["guidance"] if guidance is None else guidance
    frames = frames or profile.get("frames")
    call = dict(generator=torch.Generator("cpu").manual_seed(seed), num_inference_steps=steps,
                height=height or profile["height"], width=width or profile["width"],
                max_sequence_length=profile["max_text"], output_type="np")
    if family == "flux":
        call.update(guidance_scale=guidance)
    elif family == "qwen_image":
        call.update(true_cfg_scale=guidance, negative_prompt=" " if negative_prompt is None else negative_prompt)
    elif family == "hunyuan_video":
        call.update(guidance_scale=guidance, num_frames=frames)
    elif family == "wan":
        call.update(guidance_scale=guidance, num_frames=frames, negative_prompt=negative_prompt)
    elif family == "ltx2":  # STG and modality guidance at the pipeline's defaults, as served
        call.update(guidance_scale=guidance, num_frames=frames, negative_prompt=negative_prompt,
                    frame_rate=24.0)
    else:
        raise AssertionError(f"no pipeline oracle for family {family!r}")
    out = _pipe(model)(prompt, **call)
    pixels = out.images[0] if family in ("flux", "qwen_image") else out.frames[0]
    return (np.asarray(pixels) * 255).round().astype(np.uint8)
