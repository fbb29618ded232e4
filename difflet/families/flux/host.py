"""FLUX.1 host steps, matching diffusers' FluxPipeline (pipeline_flux.py) operation for operation.

Invariants:
- Shapes come from the IR (program input/output types), never from a diffusers config, so the
  host and the compiled programs cannot disagree: latent channels = transformer hidden_states
  width / 4, vae_scale_factor = image height / VAE latent height.
- Sampling state (CPU torch.Generator seeded with the request seed, a fresh scheduler instance)
  lives in `RequestState`, never in `HostEnv`.
- FLUX attends its T5 padding, so `valid_text` crosses as its IR default (the padded length).
- The RoPE tables (img_rope, txt_rope: [tokens, 2 * head_dim], cos | sin, float32) are diffusers'
  own FluxPosEmbed on the ids FluxPipeline builds (in its dtypes), computed here once per shape:
  FluxPosEmbed is row-wise, so cat(txt_rope, img_rope) = FluxPosEmbed(cat(txt_ids, img_ids)).
- The denoise loop's single per-step transformer call is `predict_noise`; `cached_loop` wraps
  it with the host step-cache controller (a cached step never calls the transformer).
- Image inputs (flux-img2img.dsl, flux-inpaint.dsl): `encode_image` runs the VAE encoder
  program and leaves packed `image_latents` (and a packed `latent_mask`); `denoise` then runs the
  last int(steps x strength) timesteps from the noised image latents, as FluxImg2ImgPipeline /
  FluxInpaintPipeline do, blending the kept region after each step when there is a mask.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from difflet.errors import DiffletError
from difflet.families.flux.facts import FACTS
from difflet.ir.nodes import Node, Op
from difflet.runtime.host import host_step
from difflet.runtime.host.image_inputs import (generator, packed_mask, preprocess_image, sample_latents,
                                               start_from_image)
from difflet.runtime.host.loop import cached_loop
from difflet.runtime.host.toolkit import (calculate_shift, class_config_value, guidance, input_shape,
                                          make_scheduler, pack_latents, packed_latent_geometry, unpack_latents,
                                          vae_scale)
from difflet.runtime.host.env import HostEnv, RequestState


@lru_cache(maxsize=16)
def rope_tables(axes_dim: tuple[int, ...], rows: int, cols: int, text_len: int, img_dtype: torch.dtype,
                txt_dtype: torch.dtype, context: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(img_rope [rows * cols (+ context tokens), 2D], txt_rope [text_len, 2D]) float32, cos | sin
    (module docstring); `context`: a Kontext input image's packed grid, whose ids follow the
    latents' with their first coordinate 1 (FluxKontextPipeline.prepare_latents). Cached per
    shape, so callers must not modify them."""
    from diffusers import FluxPipeline
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    # theta 10000: FluxTransformer2DModel.__init__ (transformer_flux.py) builds its pos_embed so
    pos_embed = FluxPosEmbed(theta=10000, axes_dim=list(axes_dim))
    # the ids FluxPipeline passes (pipeline_flux.py prepare_latents / encode_prompt), in its dtypes
    img_ids = FluxPipeline._prepare_latent_image_ids(1, rows, cols, torch.device("cpu"), img_dtype)
    if context is not None:
        image_ids = FluxPipeline._prepare_latent_image_ids(1, *context, torch.device("cpu"), img_dtype)
        image_ids[..., 0] = 1
        img_ids = torch.cat([img_ids, image_ids], dim=0)
    txt_ids = torch.zeros(text_len, 3).to(device=torch.device("cpu"), dtype=txt_dtype)
    tables = []
    for ids in (img_ids, txt_ids):
        cos, sin = pos_embed(ids)  # float64 inside on CPU, float32 out
        tables.append(torch.cat([cos, sin], dim=-1).float().contiguous())
    return tables[0], tables[1]



# ---- the four steps


def tokenize(env: HostEnv, component: Node, prompt: str) -> torch.Tensor:
    """input_ids [1, max_length], padded to max_length and truncated, as FluxPipeline does."""
    tokenizer, max_length = env.tokenizer(component)
    ids = tokenizer([prompt], padding="max_length", max_length=max_length, truncation=True,
                    return_length=False, return_overflowing_tokens=False,
                    return_tensors="pt").input_ids
    return ids


@host_step("flux.encode_prompt", phase="encode")
def encode_prompt(env: HostEnv, step: Node, state: RequestState) -> None:
    """CLIP pooled vector (args[0]) + T5 sequence embeddings (args[1])."""
    clip, t5 = (env.component(name) for name in step.args)
    prompt = state.params.prompt
    pooled = env.invoke(clip.name, input_ids=tokenize(env, clip, prompt))
    embeds = env.invoke(t5.name, input_ids=tokenize(env, t5, prompt))
    state.values["pooled_projections"] = next(iter(pooled.values()))
    state.values["encoder_hidden_states"] = next(iter(embeds.values()))


@host_step("flux.prepare_latents", phase="denoise")
def prepare_latents(env: HostEnv, step: Node, state: RequestState) -> None:
    """Seeded noise from a CPU generator (the reference's exact draw), packed 2x2."""
    from diffusers.utils.torch_utils import randn_tensor

    params = state.params
    channels, height, width = packed_latent_geometry(env.module, env.profile, params.height, params.width)
    noise = randn_tensor((1, channels, height, width), generator=generator(state),
                         device=torch.device("cpu"), dtype=torch.float32)
    state.values["latents"] = pack_latents(noise)
    state.values["latent_grid"] = (height // 2, width // 2)  # packed tokens per side: the RoPE grid


@host_step("flux.encode_image", phase="encode")
def encode_image(env: HostEnv, step: Node, state: RequestState) -> None:
    """The input image through the VAE encoder program as FluxImg2ImgPipeline._encode_vae_image
    (a latent sample drawn with the request's generator, shifted and scaled), packed; with a mask,
    FluxInpaintPipeline's latent mask (nearest-resized, one channel per latent channel, packed).
    The inpainting pipeline also encodes the masked image, but only a 64-channel (Fill)
    transformer reads it and its draw comes after the noise's, so it is not run."""
    (vae_name,) = step.args
    vae, params = env.component(vae_name), state.params
    if not params.image:
        raise DiffletError("this model's schedule encodes an input image, and the request has none",
                           where="image")
    use = step.attrs.get("use", "start")
    if use not in ("start", "context"):
        raise DiffletError(f"flux.encode_image: use is 'start' (img2img, inpaint) or 'context' (Kontext), "
                           f"not {use!r}", where=step.loc)
    channels, height, width = packed_latent_geometry(env.module, env.profile, params.height, params.width)
    factor, latent_channels = 2 * vae_scale(env.module, env.profile), class_config_value(vae, "latent_channels")
    dtype = state.values["encoder_hidden_states"].dtype  # the pipeline casts the image to prompt_embeds'
    pixels = params.image[0]
    image = preprocess_image(state, factor, latent_channels, pixels.width, pixels.height).to(dtype)
    moments = next(iter(env.invoke(vae_name, **{vae.find(Op.INPUT)[0].name: image}).values()))
    scaling, shift = (class_config_value(vae, k) for k in ("scaling_factor", "shift_factor"))
    # Kontext reads the image's mean (sample_mode "argmax"): no draw from the generator
    latents = (sample_latents(moments, state, "argmax" if use == "context" else "sample") - shift) * scaling
    if use == "context":  # appended to the denoiser's visual tokens at every step
        state.values["context_latents"] = pack_latents(latents.to(dtype))
        state.values["context_grid"] = (latents.shape[2] // 2, latents.shape[3] // 2)
        return
    state.values["image_latents"] = pack_latents(latents.to(dtype))
    if params.mask_image is not None:
        state.values["latent_mask"] = packed_mask(state, factor, latent_channels, channels, height, width, dtype)


def timesteps_for(scheduler, num_steps: int, image_seq_len: int) -> torch.Tensor:
    """FluxPipeline's schedule: sigmas linspace(1, 1/N, N), resolution shift mu, begin index 0."""
    sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
    if getattr(scheduler.config, "use_flow_sigmas", False):
        sigmas = None
    cfg = scheduler.config
    mu = calculate_shift(image_seq_len, cfg.get("base_image_seq_len", 256),
                         cfg.get("max_image_seq_len", 4096), cfg.get("base_shift", 0.5),
                         cfg.get("max_shift", 1.15))
    if sigmas is None:
        scheduler.set_timesteps(num_steps, device="cpu", mu=mu)
    else:
        scheduler.set_timesteps(sigmas=sigmas, device="cpu", mu=mu)
    scheduler.set_begin_index(0)
    return scheduler.timesteps


def denoiser_inputs(state: RequestState, latents: torch.Tensor, t: torch.Tensor) -> dict:
    """The transformer's inputs for step timestep `t` by IR name (the probe reads the same)."""
    values = state.values
    context = values.get("context_latents")
    return dict(
        hidden_states=latents if context is None else torch.cat([latents, context], dim=1),
        encoder_hidden_states=values["encoder_hidden_states"],
        pooled_projections=values["pooled_projections"],
        timestep=t.expand(latents.shape[0]).to(latents.dtype) / 1000,
        img_rope=values["img_rope"],
        txt_rope=values["txt_rope"],
        **values["denoise_extra"],
    )


def predict_noise(env: HostEnv, component: str, state: RequestState, latents: torch.Tensor,
                  t: torch.Tensor) -> torch.Tensor:
    """One transformer call for step timestep `t` (the per-step seam step caching wraps)."""
    out = next(iter(env.invoke(component, **denoiser_inputs(state, latents, t)).values()))
    return out[:, :latents.shape[1]]  # Kontext: the appended image tokens' outputs are dropped


@host_step("flux.denoise", phase="denoise")
def denoise(env: HostEnv, step: Node, state: RequestState) -> None:
    """Flow-matching Euler loop with embedded (distilled) guidance, or none.

    Mode "none" is a transformer without guidance embeds (guidance_embeds false): FluxPipeline
    passes guidance=None, so the program has no `guidance` input and none is passed.
    """
    (transformer,) = step.args
    mode = guidance(step, FACTS, ("embedded", "none"))["mode"]
    names = {n.name for n in env.component(transformer).find(Op.INPUT)}
    if (mode == "none") == ("guidance" in names):  # a mismatch would silently drop or invent it
        raise DiffletError(f"guidance mode {mode!r} but transformer {transformer!r} "
                           f"{'has' if 'guidance' in names else 'has no'} guidance input",
                           where=step.loc)
    extra = {}
    if "guidance" in names:
        extra["guidance"] = torch.full([1], state.params.guidance, dtype=torch.float32)
    if "valid_text" in names:
        extra["valid_text"] = env.runtime_default("valid_text")
    state.values["denoise_extra"] = extra
    state.values["img_rope"], state.values["txt_rope"] = denoiser_rope(env.component(transformer), state)

    scheduler = make_scheduler(step)
    latents = state.values["latents"]
    timesteps = timesteps_for(scheduler, state.params.steps, latents.shape[1])
    timesteps, latents, blend = start_from_image(state, scheduler, timesteps, latents)
    state.values["latents"] = cached_loop(
        env, state, scheduler, timesteps, latents,
        predict=lambda x, t: predict_noise(env, transformer, state, x, t),
        probe_inputs=lambda x, t: denoiser_inputs(state, x, t), blend=blend)


def denoiser_rope(transformer: Node, state: RequestState) -> tuple[torch.Tensor, torch.Tensor]:
    """The request's RoPE tables, checked against the program's img_rope/txt_rope widths."""
    axes = tuple(int(d) for d in class_config_value(transformer, "axes_dims_rope"))
    text = state.values["encoder_hidden_states"]
    # FluxPipeline: latent ids in prompt_embeds' dtype, text ids in the CLIP encoder's
    img, txt = rope_tables(axes, *state.values["latent_grid"], text.shape[1], text.dtype,
                           state.values["pooled_projections"].dtype, state.values.get("context_grid"))
    for name, table in (("img_rope", img), ("txt_rope", txt)):
        width = input_shape(transformer, name)[-1]
        if width != table.shape[-1]:
            raise DiffletError(f"transformer input {name!r} is {width} wide, but axes_dims_rope {list(axes)} "
                               f"gives tables of 2 * {sum(axes)} = {table.shape[-1]} (cos | sin)",
                               where=transformer.loc)
    return img, txt


@host_step("flux.decode", phase="decode")
def decode(env: HostEnv, step: Node, state: RequestState) -> None:
    """Unpack, undo scaling/shift, VAE program, postprocess to uint8 [H, W, 3]."""
    from diffusers.image_processor import VaeImageProcessor

    (vae_name,) = step.args
    vae = env.component(vae_name)
    _, height, width = packed_latent_geometry(env.module, env.profile, state.params.height, state.params.width)
    latents = unpack_latents(state.values["latents"], height, width)
    scaling, shift = (class_config_value(vae, k) for k in ("scaling_factor", "shift_factor"))
    if scaling is None or shift is None:  # FluxPipeline would fail on None too
        raise DiffletError(f"VAE {vae_name!r} needs scaling_factor and shift_factor in its config",
                           where=vae.loc)
    latents = latents / scaling + shift
    z_name = vae.find(Op.INPUT)[0].name
    image = next(iter(env.invoke(vae_name, **{z_name: latents}).values()))
    state.values["decoded"] = image
    array = VaeImageProcessor(do_resize=False).postprocess(image, output_type="np")
    state.image = (array[0] * 255).round().astype("uint8")
