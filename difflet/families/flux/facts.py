"""FLUX's facts: both encoders read the bare prompt; embedded guidance (one pass); images;
FluxTransformer2DModel's split rules, and its split, probe and neuron SPMD programs are built."""
from __future__ import annotations

from difflet.families.facts import FamilyFacts
from difflet.families.split_globs import dual_single_stream

DENOISER = "diffusers.FluxTransformer2DModel"

FACTS = FamilyFacts(
    default_guidance="embedded",
    rules={DENOISER: dict(dual_single_stream(),
                          probe=("x_embedder", "time_text_embed", "transformer_blocks.0.norm1"))},
    split_built=(DENOISER,), probe_built=(DENOISER,), spmd_built=(DENOISER,),
)
