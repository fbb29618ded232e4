"""FLUX denoiser inputs two ways: the program's (the host's RoPE tables) and diffusers' (FluxPipeline's ids)."""
from __future__ import annotations

import math

import torch


def program_and_diffusers_inputs(axes_dims_rope, x):
    """(program inputs with the host's RoPE tables, FluxTransformer2DModel's inputs with position ids)
    for the program inputs `x` in IR order (hidden_states, encoder_hidden_states, pooled_projections,
    timestep, img_rope, txt_rope, guidance, valid_text) of a square latent grid.
    The ids are written out here as FluxPipeline lays them (channel 1 the row, 2 the column, text all
    zero), independently of the host's rope_tables, which builds the program's side."""
    from difflet.families.flux.host import rope_tables

    side, text = math.isqrt(x[0].shape[1]), x[1].shape[1]
    assert side * side == x[0].shape[1], "a square latent grid"
    img_ids = torch.zeros(side, side, 3)
    img_ids[..., 1], img_ids[..., 2] = torch.arange(side)[:, None], torch.arange(side)[None, :]
    tables = rope_tables(tuple(axes_dims_rope), side, side, text, x[0].dtype, x[0].dtype)
    ours = [*x[:4], *tables, *x[6:]]
    return ours, [*x[:4], img_ids.reshape(-1, 3), torch.zeros(text, 3), *x[6:]]
