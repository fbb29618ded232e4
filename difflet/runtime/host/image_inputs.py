"""What image-input host steps share (image-to-image, inpainting): the request's generator, the
reference pipelines' image and mask preprocessing, the VAE latent sample, the strength schedule
and the inpainting blend. Names no family.

Invariants:
- The input image arrives as `Pixels` already at the request's size (runtime/images.py), so the
  pipeline's own VaeImageProcessor.preprocess does a same-size resize (a copy) and the tensors
  equal the reference pipeline's for the original file.
- One CPU generator per request (`generator`), drawn from in the reference's order: the VAE
  latent sample (encode step) before the initial noise (prepare-latents step).
- The strength never reaches a program: it picks the first timestep and the number of steps
  run on the host (`strength_timesteps`), so no strength, mask or image recompiles anything.
"""
from __future__ import annotations

import torch

from difflet.runtime.host.env import RequestState
from difflet.runtime.host.toolkit import pack_latents
from difflet.runtime.images import to_pil


def generator(state: RequestState) -> torch.Generator:
    """The request's CPU generator, seeded with its seed on first use (the reference's one
    `torch.Generator("cpu").manual_seed(seed)`)."""
    gen = state.values.get("generator")
    if gen is None:
        gen = state.values["generator"] = torch.Generator("cpu").manual_seed(state.params.seed)
    return gen


def preprocess_image(state: RequestState, vae_scale_factor: int, latent_channels: int,
                     width: int | None = None, height: int | None = None, index: int = 0) -> torch.Tensor:
    """The request's input image `index` (default the first) as the pipeline's
    image_processor.preprocess makes it at width x height (default: the request's size): float32
    [1, 3, H, W] in [-1, 1]."""
    from diffusers.image_processor import VaeImageProcessor

    params = state.params
    processor = VaeImageProcessor(vae_scale_factor=vae_scale_factor, vae_latent_channels=latent_channels)
    image = processor.preprocess(to_pil(params.image[index]), height=height or params.height,
                                 width=width or params.width)
    return image.to(dtype=torch.float32)


def preprocess_mask(state: RequestState, vae_scale_factor: int, latent_channels: int) -> torch.Tensor:
    """The request's mask as the inpainting pipelines' mask_processor makes it: float32
    [1, 1, H, W], binarized (1 = repaint)."""
    from diffusers.image_processor import VaeImageProcessor

    params = state.params
    processor = VaeImageProcessor(vae_scale_factor=vae_scale_factor, vae_latent_channels=latent_channels,
                                  do_normalize=False, do_binarize=True, do_convert_grayscale=True)
    return processor.preprocess(to_pil(params.mask_image), height=params.height, width=params.width)


def sample_latents(moments: torch.Tensor, state: RequestState, mode: str = "sample") -> torch.Tensor:
    """A VAE encoder program's mean | logvar as diffusers' retrieve_latents reads them: a sample
    drawn with the request's generator ("sample") or the mean ("argmax")."""
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    dist = DiagonalGaussianDistribution(moments)
    return dist.sample(generator(state)) if mode == "sample" else dist.mode()


def strength_timesteps(scheduler, timesteps: torch.Tensor, num_steps: int, strength: float):
    """(the timesteps run, their first index) as the image-to-image pipelines' get_timesteps:
    the last min(num_steps x strength, num_steps) steps, the scheduler's begin index set."""
    init_timestep = min(num_steps * strength, num_steps)
    t_start = int(max(num_steps - init_timestep, 0))
    timesteps = timesteps[t_start * scheduler.order:]
    if hasattr(scheduler, "set_begin_index"):
        scheduler.set_begin_index(t_start * scheduler.order)
    return timesteps, t_start


def packed_mask(state: RequestState, vae_scale_factor: int, latent_channels: int, channels: int,
                height: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """The inpainting pipelines' latent mask: the processed mask nearest-resized to the latent
    grid, in the latents' dtype, one copy per latent channel, packed 2x2."""
    mask = preprocess_mask(state, vae_scale_factor, latent_channels)
    mask = torch.nn.functional.interpolate(mask, size=(height, width)).to(dtype)
    return pack_latents(mask.repeat(1, channels, 1, 1))


def start_from_image(state: RequestState, scheduler, timesteps: torch.Tensor, latents: torch.Tensor):
    """(timesteps run, initial latents, per-step blend or None) of a request: an image-input one
    (packed `image_latents` in state) runs the strength's last timesteps from the image latents
    noised to the first of them, as the img2img/inpaint pipelines do; any other is unchanged."""
    image_latents = state.values.get("image_latents")
    if image_latents is None:
        return timesteps, latents, None
    timesteps, _ = strength_timesteps(scheduler, timesteps, state.params.steps, state.params.strength)
    noise = latents
    latents = scheduler.scale_noise(image_latents, timesteps[:1], noise)  # elementwise: packing commutes
    mask = state.values.get("latent_mask")
    blend = None if mask is None else InpaintBlend(scheduler, timesteps, image_latents, noise, mask)
    return timesteps, latents, blend


class InpaintBlend:
    """The inpainting pipelines' per-step blend: after step i, the kept region (mask 0) is the
    image latents noised to the next timestep (unnoised after the last), the rest the sample."""

    def __init__(self, scheduler, timesteps: torch.Tensor, image_latents: torch.Tensor,
                 noise: torch.Tensor, mask: torch.Tensor) -> None:
        self.scheduler, self.timesteps = scheduler, timesteps
        self.image_latents, self.noise, self.mask = image_latents, noise, mask

    def __call__(self, i: int, latents: torch.Tensor) -> torch.Tensor:
        proper = self.image_latents
        if i < len(self.timesteps) - 1:
            proper = self.scheduler.scale_noise(proper, torch.tensor([self.timesteps[i + 1]]), self.noise)
        return (1 - self.mask) * proper + self.mask * latents
