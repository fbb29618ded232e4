"""Wan 2.1's facts: WanPipeline's prompt_clean, cfg guidance, 16 fps."""
from __future__ import annotations

import html

from difflet.families.facts import FamilyFacts
from difflet.families.split_globs import ATTN_COL, paths

DENOISER = "diffusers.WanTransformer3DModel"

FPS = 16.0  # the fps WanPipeline's examples export at (export_to_video(..., fps=16))


def prompt_clean(text: str) -> str:
    """WanPipeline's prompt_clean: basic_clean (ftfy if installed, html unescape x2, strip),
    then whitespace runs -> one space, strip."""
    import regex

    try:
        import ftfy
    except ImportError:  # the pipeline skips ftfy when it is not installed, and so do we
        ftfy = None
    if ftfy is not None:
        text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return regex.sub(r"\s+", " ", text).strip()


FACTS = FamilyFacts(
    description=lambda ckpt: "wan2.1",
    prompt_text=lambda prompt, templated: prompt_clean(prompt), default_guidance="cfg", fps=lambda module: FPS,
    rules={DENOISER: {
        "column": paths("blocks.*.attn1", ATTN_COL) + paths("blocks.*.attn2", ATTN_COL) + ("blocks.*.ffn.net.0.proj",),
        "row": ("blocks.*.attn1.to_out.0", "blocks.*.attn2.to_out.0", "blocks.*.ffn.net.2"),
        "row_segments": {},
        "heads_norm_across": True,
        "probe": ("patch_embedding", "condition_embedder", "blocks.0.scale_shift_table", "blocks.0.norm1"),
        "cfg_branch": ("encoder_hidden_states",),
    }},
    # not spmd_built: its tp layout all-reduces the q/k RMSNorm statistics across heads, a
    # collective outside NxD's parallel linears (codegen/neuron_spmd.py)
    split_built=(DENOISER,), probe_built=(DENOISER,),
)
