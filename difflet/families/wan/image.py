"""Wan image-to-video host steps and the first-frame blend, matching diffusers'
WanImageToVideoPipeline (pipeline_wan_i2v.py) operation for operation (host.py's docstring states
the invariants of both conditioning modes: the channel condition and, with expand_timesteps, the
image's latent as frame 0 with t per token)."""
from __future__ import annotations

import torch

from difflet.errors import DiffletError
from difflet.families.facts import step_attr
from difflet.families.wan.nodes import input_type, temporal_scale, transformer
from difflet.ir.nodes import Node, Op
from difflet.runtime.host import host_step
from difflet.runtime.host.env import HostEnv, RequestState
from difflet.runtime.host.image_inputs import preprocess_image, sample_latents
from difflet.runtime.host.toolkit import class_config_value
from difflet.runtime.images import to_pil


def _image_processor(env: HostEnv):
    """The checkpoint's CLIPImageProcessor (the artifact's host/ copy), loaded once per server."""
    from difflet.families.wan.programs import IMAGE_PROCESSOR

    def load():
        from transformers import CLIPImageProcessor

        path = env.host_dir / IMAGE_PROCESSOR
        if not path.is_dir():
            raise DiffletError("image processor directory missing from the artifacts", where=str(path))
        return CLIPImageProcessor.from_pretrained(str(path))

    return env.asset("image-processor", load)


@host_step("wan.encode_image", phase="encode")
def encode_image(env: HostEnv, step: Node, state: RequestState) -> None:
    """WanImageToVideoPipeline's encode_image (CLIP hidden_states[-2]; only with a CLIP encoder,
    `wan.encode_image(image_encoder, vae)`: Wan 2.1's transformer has image_dim, Wan 2.2 I2V's
    none, `wan.encode_image(vae)`) and prepare_latents' condition: [mask (temporal-scale channels,
    1 on frame 0) | normalized VAE mean of the clip image + zero frames], float32. With the
    profile's `last_image` (FLF2V) CLIP reads both images as one batch, the clip ends with the
    last image and the mask is 1 on the last frame too."""
    *clip, vae_name = step.args
    params, vae = state.params, env.component(vae_name)
    last = bool(env.profile.get("last_image", False))
    if len(params.image) != (2 if last else 1):
        want = "2 input images: the first and the last frame" if last else "an input image"
        raise DiffletError(f"this image-to-video model needs {want}; {len(params.image)} given", where="image")
    if clip:
        # the pipeline hands CLIP's processor the images as given (the profile's image_original)
        originals = params.image_original or params.image
        pixels = _image_processor(env)(images=[to_pil(x) for x in originals], return_tensors="pt").pixel_values
        clip_node = env.component(clip[0])
        embeds = next(iter(env.invoke(clip[0], **{clip_node.find(Op.INPUT)[0].name: pixels}).values()))
        state.values["image_embeds"] = embeds.to(getattr(torch, input_type(transformer(env), "hidden_states").dtype))
    (x,) = vae.find(Op.INPUT)
    _, _, frames, height, width = x.results[0].type.shape
    expand = bool(step_attr(env.module, "wan.denoise", "expand_timesteps", False))
    if expand and (clip or frames != 1):
        raise DiffletError(f"with expand_timesteps the VAE encoder {vae_name!r} encodes the image alone "
                           f"(x: [1, 3, 1, H, W], no CLIP encoder), as WanImageToVideoPipeline does; it "
                           f"takes {frames} frames" + (" and a CLIP encoder" if clip else ""), where=step.loc)
    z_dim, scale = int(class_config_value(vae, "z_dim")), temporal_scale(env)
    spatial = height // vae.find(Op.OUTPUT)[0].results[0].type.shape[3]
    image = preprocess_image(state, spatial, z_dim).unsqueeze(2)  # the pipeline's VideoProcessor
    ends = [preprocess_image(state, spatial, z_dim, index=1).unsqueeze(2)] if last else []
    clip = torch.cat([image, image.new_zeros(1, 3, frames - 1 - len(ends), height, width), *ends], dim=2)
    moments = next(iter(env.invoke(vae_name, **{x.name: clip}).values()))
    latent = sample_latents(moments, state, mode="argmax").to(torch.float32)
    h, w = latent.shape[3], latent.shape[4]
    mean = torch.tensor(class_config_value(vae, "latents_mean")).view(1, z_dim, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(class_config_value(vae, "latents_std")).view(1, z_dim, 1, 1, 1)
    latent = (latent - mean) * inv_std
    if expand:  # frame 0 of the latents is the image's: blended in by denoiser_inputs and denoise
        state.values["first_frame"] = latent
        return
    mask = torch.ones(1, 1, frames, h, w)
    mask[:, :, 1:frames - 1 if last else frames] = 0  # the pipeline's mask_lat_size
    first = torch.repeat_interleave(mask[:, :, 0:1], dim=2, repeats=scale)
    mask = torch.cat([first, mask[:, :, 1:]], dim=2).view(1, -1, scale, h, w).transpose(1, 2)
    state.values["condition"] = torch.cat([mask, latent], dim=1)


def first_frame_mask(latents: torch.Tensor) -> torch.Tensor:
    """WanImageToVideoPipeline's expand_timesteps mask [1, 1, F, h, w]: 0 on latent frame 0, else 1."""
    mask = torch.ones(1, 1, *latents.shape[2:], dtype=latents.dtype)
    mask[:, :, 0] = 0
    return mask


def with_first_frame(state: RequestState, latents: torch.Tensor) -> torch.Tensor:
    """The pipeline's (1 - mask) * condition + mask * latents: frame 0 is the image's latent."""
    mask = first_frame_mask(latents)
    return (1 - mask) * state.values["first_frame"] + mask * latents
