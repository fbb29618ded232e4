"""Wan 2.1's facts (and Wan 2.2's, the same classes): WanPipeline's prompt_clean, cfg guidance,
the fps `wan.decode` declares, the description a checkpoint takes, and the keys a description's
shapes read that AutoencoderKLWan's config does not state (`vae_derived`)."""
from __future__ import annotations

import html
import json
from pathlib import Path

from difflet.families.facts import FamilyFacts, step_attr
from difflet.families.split_globs import ATTN_COL, paths

DENOISER = "diffusers.WanTransformer3DModel"

FPS = 16.0  # the fps WanPipeline's examples export at (export_to_video(..., fps=16))


def fps(module) -> float:
    """`wan.decode`'s `fps` (Wan 2.2 TI2V-5B's 24), else Wan 2.1's 16."""
    return float(step_attr(module, "wan.decode", "fps", FPS))


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


VAE = "diffusers.AutoencoderKLWan"
# AutoencoderKLWan.__init__'s defaults for the keys its decoder's structure depends on
VAE_DEFAULTS = {"base_dim": 96, "decoder_base_dim": None, "z_dim": 16, "dim_mult": [1, 2, 4, 4],
                "num_res_blocks": 2, "temperal_downsample": [False, True, True], "is_residual": False}


def vae_derived(config: dict) -> dict[str, int]:
    """AutoencoderKLWan's decoder structure as numbers (torch-free; wan/vae.py checks the chunk
    program's declared caches against the model itself):
    - `scale_factor_temporal`: 2 ** (temporal upsamples), what WanPipeline reads from a config
      that states it (older config.json files do not; a stated one is never replaced);
    - `cache<k>_channels`: the causal caches at spatial level k (0: latent), summed over the
      inputs of that level's cached convs in decode order: conv_in (z_dim) and the mid block's 2
      resnets at level 0, up block k's resnets (conv1 and conv2 each) and its temporal upsampler's
      time_conv, conv_out at the last level.
    Wan 2.2's residual VAE (is_residual, TI2V-5B) has the same cached convs, but its upsamplers keep
    their channels (`upsample_out_dim=out_dim`), so no up block's input is halved."""
    cfg = {**VAE_DEFAULTS, **config}
    dim = cfg["decoder_base_dim"] or cfg["base_dim"]
    mult, blocks = list(cfg["dim_mult"]), int(cfg["num_res_blocks"]) + 1
    upsample_t = list(cfg["temperal_downsample"])[::-1]
    dims = [dim * m for m in [mult[-1], *mult[::-1]]]  # WanDecoder3d's dims
    derived = {"scale_factor_temporal": 2 ** sum(bool(upsample_t[i]) for i in range(len(mult) - 1))}
    for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
        in_dim = in_dim // 2 if i > 0 and not cfg["is_residual"] else in_dim  # Wan 2.1's upsampler halves
        channels = in_dim + (2 * blocks - 1) * out_dim
        if i == 0:
            channels += cfg["z_dim"] + 4 * dims[0]  # conv_in, the mid block's two resnets
        if i != len(mult) - 1 and upsample_t[i]:
            channels += out_dim  # upsample3d's time_conv
        if i == len(mult) - 1:
            channels += out_dim  # conv_out
        derived[f"cache{i}_channels"] = channels
    return derived


def description(ckpt: Path) -> str:
    """From model_index.json: wan2.2-a14b for a WanPipeline with a low-noise expert (it lists a
    transformer_2, as Wan2.2-T2V-A14B-Diffusers does), wan2.2-ti2v-5b for one with expand_timesteps
    (Wan2.2-TI2V-5B-Diffusers), else wan2.1."""
    index = json.loads((Path(ckpt) / "model_index.json").read_text())
    second = index.get("transformer_2")
    if isinstance(second, list) and second and second[0]:
        return "wan2.2-a14b"
    return "wan2.2-ti2v-5b" if index.get("expand_timesteps") is True else "wan2.1"


def i2v_description(ckpt: Path) -> str:
    """A WanImageToVideoPipeline checkpoint: wan2.2-i2v-a14b when it lists a low-noise expert
    (Wan2.2-I2V-A14B-Diffusers), wan2.2-ti2v-5b-i2v when it states expand_timesteps (TI2V-5B's
    image to video), wan2.1-flf2v when its transformer embeds two images' positions
    (`pos_embed_seq_len`: Wan2.1-FLF2V-14B-720P-Diffusers), else wan2.1-i2v (Wan2.1-I2V-14B-*)."""
    base = description(ckpt)
    if base != "wan2.1":
        return {"wan2.2-a14b": "wan2.2-i2v-a14b", "wan2.2-ti2v-5b": "wan2.2-ti2v-5b-i2v"}[base]
    config = Path(ckpt) / "transformer" / "config.json"
    two = config.is_file() and json.loads(config.read_text()).get("pos_embed_seq_len") is not None
    return "wan2.1-flf2v" if two else "wan2.1-i2v"


FACTS = FamilyFacts(
    description=description,
    pipelines={"WanImageToVideoPipeline": i2v_description},
    prompt_text=lambda prompt, templated: prompt_clean(prompt), default_guidance="cfg", fps=fps,
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
    split_built=(DENOISER,), probe_built=(DENOISER,), blocks_built=(DENOISER,),
    derived_config={VAE: vae_derived},
)
