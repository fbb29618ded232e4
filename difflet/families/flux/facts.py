"""FLUX's facts: both encoders read the bare prompt; embedded guidance (one pass); images;
FluxTransformer2DModel's split rules, and its split, probe and neuron SPMD programs are built."""
from __future__ import annotations

import json
from pathlib import Path

from difflet.families.facts import FamilyFacts
from difflet.families.split_globs import dual_single_stream

DENOISER = "diffusers.FluxTransformer2DModel"


def description(ckpt) -> str:
    """flux-schnell.dsl (no guidance input, guidance mode "none") for a transformer without a
    guidance embedding (FLUX.1-schnell and its fine-tunes), else flux.dsl."""
    config = json.loads((Path(ckpt) / "transformer" / "config.json").read_text())
    return "flux" if config.get("guidance_embeds", False) else "flux-schnell"


# FluxKontextPipeline's PREFERRED_KONTEXT_RESOLUTIONS (diffusers pipelines/flux/pipeline_flux_kontext.py):
# with `_auto_resize` (its default) an input image is resized to the one nearest its aspect ratio
KONTEXT_RESOLUTIONS = ((672, 1568), (688, 1504), (720, 1456), (752, 1392), (800, 1328), (832, 1248),
                       (880, 1184), (944, 1104), (1024, 1024), (1104, 944), (1184, 880), (1248, 832),
                       (1328, 800), (1392, 752), (1456, 720), (1504, 688), (1568, 672))

FACTS = FamilyFacts(
    description=description,
    default_guidance="embedded",
    rules={DENOISER: dict(dual_single_stream(),
                          probe=("x_embedder", "time_text_embed", "transformer_blocks.0.norm1"))},
    split_built=(DENOISER,), probe_built=(DENOISER,), blocks_built=(DENOISER,), spmd_built=(DENOISER,),
    input_sizes=KONTEXT_RESOLUTIONS,
    pipelines={"FluxKontextPipeline": "flux-kontext"},  # FLUX.1-Kontext-dev: FLUX.1's components
)
