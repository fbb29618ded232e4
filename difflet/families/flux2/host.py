"""FLUX.2 [klein] host steps, matching diffusers' Flux2KleinPipeline (pipeline_flux2_klein.py)
operation for operation, batch 1.

Invariants:
- Shapes come from the IR: the token grid (h, w) = the request size / (profile height / the VAE
  decode input's height), which is the pipeline's 2 * vae_scale_factor; latent channels = the
  transformer's hidden_states width.
- Text: the prompt rendered by the tokenizer's own chat template (one user message,
  add_generation_prompt, enable_thinking=False), right-padded and truncated to the encoder's
  static length; valid_text = the attention mask's count crosses into the encoder program, which
  returns the stacked layers (programs.py); every row goes to the denoiser (the pipeline masks
  nothing there).
- Guidance: mode "cfg" runs the pipeline's CFG (neg + s * (cond - neg)) when guidance > 1, the
  negative prompt defaulting to the pipeline's ""; mode "none" (a step-distilled checkpoint,
  `is_distilled`) runs one pass whatever the request's guidance, as the pipeline ignores it.
- The RoPE tables are diffusers' Flux2PosEmbed on the pipeline's ids (latents: (0, row, col, 0);
  text: (0, 0, 0, index)), computed once per shape on the host; sampling state lives in
  RequestState.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from difflet.errors import DiffletError
from difflet.families.flux2.facts import DEFAULT_NEGATIVE_PROMPT, FACTS
from difflet.ir.nodes import Node, Op
from difflet.runtime.host import host_step
from difflet.runtime.host.cfg import predict_branches
from difflet.runtime.host.env import HostEnv, RequestState
from difflet.runtime.host.image_inputs import generator
from difflet.runtime.host.loop import cached_loop
from difflet.runtime.host.toolkit import (class_config_value, guidance, input_shape, io_shape, make_scheduler,
                                          schedule_step)


@lru_cache(maxsize=16)
def rope_tables(axes_dim: tuple[int, ...], theta: float, rows: int, cols: int,
                text_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(img_rope [rows * cols, 2D], txt_rope [text_len, 2D]) float32, cos | sin: Flux2PosEmbed on
    the ids Flux2KleinPipeline builds (_prepare_latent_ids / _prepare_text_ids). Cached per shape:
    callers must not modify them."""
    from diffusers.models.transformers.transformer_flux2 import Flux2PosEmbed

    pos_embed = Flux2PosEmbed(theta=theta, axes_dim=list(axes_dim))
    zero = torch.arange(1)
    img_ids = torch.cartesian_prod(zero, torch.arange(rows), torch.arange(cols), zero)
    txt_ids = torch.cartesian_prod(zero, zero, zero, torch.arange(text_len))
    return tuple(torch.cat(pos_embed(ids), dim=-1).float().contiguous() for ids in (img_ids, txt_ids))


def _mode(step: Node) -> str:
    return guidance(step, FACTS, ("cfg", "none"))["mode"]


def encode_text(env: HostEnv, encoder: Node, prompt: str) -> torch.Tensor:
    """One prompt -> the stacked text features [1, L, 3D] (every row, padding included)."""
    tokenizer, max_length = env.tokenizer(encoder)
    static = input_shape(encoder, "input_ids")[1]
    if max_length != static:
        raise DiffletError(f"text encoder {encoder.name!r} takes {static} tokens, its tokenizer pads to "
                           f"{max_length}", where=encoder.loc)
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)
    tokens = tokenizer(text, return_tensors="pt", padding="max_length", truncation=True, max_length=max_length)
    valid = torch.tensor(int(tokens.attention_mask[0].sum()), dtype=torch.int64)
    return next(iter(env.invoke(encoder.name, input_ids=tokens.input_ids, valid_text=valid).values()))


@host_step("flux2.encode_prompt", phase="encode")
def encode_prompt(env: HostEnv, step: Node, state: RequestState) -> None:
    """Prompt (and, with CFG on, negative prompt) features."""
    (encoder,) = (env.component(name) for name in step.args)
    params = state.params
    cfg = _mode(schedule_step(env.module, "flux2.denoise")) == "cfg" and params.guidance > 1
    state.values["cond"] = encode_text(env, encoder, params.prompt)
    if cfg:
        negative = DEFAULT_NEGATIVE_PROMPT if params.negative_prompt is None else params.negative_prompt
        state.values["uncond"] = encode_text(env, encoder, negative)


def token_grid(env: HostEnv, height: int, width: int) -> tuple[int, int]:
    """(rows, cols) of visual tokens for a request size (module docstring)."""
    factor = int(env.profile["height"]) // io_shape(env.module.components("decoder")[0], Op.INPUT)[-2]
    return int(height) // factor, int(width) // factor


@host_step("flux2.prepare_latents", phase="denoise")
def prepare_latents(env: HostEnv, step: Node, state: RequestState) -> None:
    """Seeded noise [1, C, rows, cols] from a CPU generator in the text features' dtype (the
    pipeline's exact draw), flattened to tokens."""
    from diffusers.utils.torch_utils import randn_tensor

    rows, cols = token_grid(env, state.params.height, state.params.width)
    channels = input_shape(env.module.components("denoiser")[0], "hidden_states")[-1]
    noise = randn_tensor((1, channels, rows, cols), generator=generator(state), device=torch.device("cpu"),
                         dtype=state.values["cond"].dtype)
    state.values["latents"] = noise.reshape(1, channels, rows * cols).permute(0, 2, 1)
    state.values["latent_grid"] = (rows, cols)


def timesteps_for(scheduler, num_steps: int, image_seq_len: int) -> torch.Tensor:
    """The pipeline's schedule: sigmas linspace(1, 1/N, N) (none with use_flow_sigmas), the
    pipeline's own empirical mu, begin index 0."""
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
    mu = compute_empirical_mu(image_seq_len, num_steps)
    if getattr(scheduler.config, "use_flow_sigmas", False):
        scheduler.set_timesteps(num_steps, device="cpu", mu=mu)
    else:
        scheduler.set_timesteps(sigmas=sigmas, device="cpu", mu=mu)
    scheduler.set_begin_index(0)
    return scheduler.timesteps


def denoiser_inputs(state: RequestState, text: torch.Tensor, latents: torch.Tensor, t: torch.Tensor) -> dict:
    """The transformer's inputs by IR name for one pass."""
    return dict(hidden_states=latents, encoder_hidden_states=text,
                timestep=t.expand(latents.shape[0]).to(latents.dtype) / 1000,
                img_rope=state.values["img_rope"], txt_rope=state.values["txt_rope"], **state.values["denoise_extra"])


def predict_noise(env: HostEnv, component: str, state: RequestState, latents: torch.Tensor,
                  t: torch.Tensor, scale: float) -> torch.Tensor:
    """One step's model output: the conditional pass and, with CFG, the negative pass (one call of
    a cfg2 program or two: host/cfg.py) combined as the pipeline does."""
    uncond = state.values.get("uncond")
    cond, neg = predict_branches(env, component, denoiser_inputs(state, state.values["cond"], latents, t),
                                 denoiser_inputs(state, uncond, latents, t) if uncond is not None else None)
    cond = next(iter(cond.values()))
    if neg is None:
        return cond
    neg = next(iter(neg.values()))
    return neg + scale * (cond - neg)


@host_step("flux2.denoise", phase="denoise")
def denoise(env: HostEnv, step: Node, state: RequestState) -> None:
    """Flow-matching Euler loop (step-cached by cached_loop) with CFG or none."""
    (transformer,) = step.args
    _mode(step)
    node = env.component(transformer)
    axes = tuple(int(d) for d in class_config_value(node, "axes_dims_rope"))
    img, txt = rope_tables(axes, float(class_config_value(node, "rope_theta")), *state.values["latent_grid"],
                           state.values["cond"].shape[1])
    for name, table in (("img_rope", img), ("txt_rope", txt)):
        if input_shape(node, name) != tuple(table.shape):
            raise DiffletError(f"transformer input {name!r} is {list(input_shape(node, name))}, but axes_dims_rope "
                               f"{list(axes)} and the request give {list(table.shape)} (cos | sin)", where=node.loc)
    state.values["img_rope"], state.values["txt_rope"] = img, txt
    names = {n.name for n in node.find(Op.INPUT)}  # valid_text: its default, every text row is attended
    state.values["denoise_extra"] = {"valid_text": env.runtime_default("valid_text")} if "valid_text" in names else {}
    scheduler = make_scheduler(step)
    latents = state.values["latents"]
    timesteps = timesteps_for(scheduler, state.params.steps, latents.shape[1])
    scale = float(state.params.guidance)
    state.values["latents"] = cached_loop(
        env, state, scheduler, timesteps, latents,
        predict=lambda x, t: predict_noise(env, transformer, state, x, t, scale),
        probe_inputs=lambda x, t: denoiser_inputs(state, state.values["cond"], x, t))


@host_step("flux2.decode", phase="decode")
def decode(env: HostEnv, step: Node, state: RequestState) -> None:
    """Tokens back to [1, C, rows, cols] (the pipeline's scatter by ids is this reshape: its ids are
    row-major), the VAE decode program (normalization, unpatchify, decode), uint8 [H, W, 3]."""
    from diffusers.image_processor import VaeImageProcessor

    (vae_name,) = step.args
    vae = env.component(vae_name)
    rows, cols = state.values["latent_grid"]
    latents = state.values["latents"]
    z_input = vae.find(Op.INPUT)[0]
    z = latents.permute(0, 2, 1).reshape(1, latents.shape[-1], rows, cols)
    z = z.to(getattr(torch, z_input.results[0].type.dtype))
    image = next(iter(env.invoke(vae_name, **{z_input.name: z}).values()))
    state.values["decoded"] = image
    array = VaeImageProcessor(do_resize=False).postprocess(image, output_type="np")
    state.image = (array[0] * 255).round().astype("uint8")
