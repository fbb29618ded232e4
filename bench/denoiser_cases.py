"""The cases of bench/denoiser_real.py: diffusers transformers at real width, 1 double + 1 single
block, random weights (seeded, saved once per family and dtype, so every variant runs the same).

  flux512-*, flux1024-*  FluxTransformer2DModel at FLUX.1-dev width (24 heads x 128 = 3072,
                         joint dim 4096, pooled 768, RoPE axes (16, 56, 56)); 1,024 or 4,096
                         visual + 512 text tokens, every text key valid (FLUX attends padding).
  hunyuan10k-bf16        HunyuanVideoTransformer3DModel at HunyuanVideo width (24 x 128, text
                         dim 4096, 2 refiner layers) at the real profile (61 frames at 320x512:
                         10,240 visual tokens) with 256 text slots of which VALID_TEXT are valid:
                         the masked case (diffusers passes the key mask, Difflet the count).
Invariant: `eager_inputs` are what the diffusers pipeline passes the module; `program_values` are
the same values keyed by the program's IR input names (the host's view, valid_text a count).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
FLUX_TEXT = 512
FLUX_CONFIG = dict(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=128,
                   num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                   guidance_embeds=True, axes_dims_rope=[16, 56, 56])
HUNYUAN_CONFIG = dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128,
                      num_layers=1, num_single_layers=1, num_refiner_layers=2, mlp_ratio=4.0, patch_size=2,
                      patch_size_t=1, qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=4096,
                      pooled_projection_dim=768, rope_theta=256.0, rope_axes_dim=[16, 56, 56])
HUNYUAN_LATENT = (16, 16, 40, 64)  # models/hunyuan-video.dsl's profile: 61 frames, 320 x 512
HUNYUAN_TEXT, VALID_TEXT = 256, 24


@dataclass(frozen=True)
class Case:
    family: str  # "flux" | "hunyuan"
    dtype: str  # "bf16" | "fp32"
    px: int = 0  # FLUX image side

    @property
    def class_name(self) -> str:
        return "FluxTransformer2DModel" if self.family == "flux" else "HunyuanVideoTransformer3DModel"

    @property
    def config(self) -> dict:
        return FLUX_CONFIG if self.family == "flux" else HUNYUAN_CONFIG

    @property
    def tokens(self) -> str:
        if self.family == "flux":
            return f"{(self.px // 16) ** 2:,} + {FLUX_TEXT}"
        f, h, w = HUNYUAN_LATENT[1:]
        return f"{f * h * w // 4:,} + {HUNYUAN_TEXT} ({VALID_TEXT} valid)"


CASES = {**{f"flux{px}-{dt}": Case("flux", dt, px) for px in (512, 1024) for dt in ("bf16", "fp32")},
         "hunyuan10k-bf16": Case("hunyuan", "bf16")}

FLUX_DENOISER = """denoiser transformer = diffusers.FluxTransformer2DModel from "transformer" {{
    config {{ {config} }}
    dtype dtype
    input hidden_states:         dtype[1, {v}, 64]
    input encoder_hidden_states: dtype[1, {text}, 4096]
    input pooled_projections:    dtype[1, 768]
    input timestep:              dtype[1]
    input img_rope:              float32[{v}, 256]
    input txt_rope:              float32[{text}, 256]
    input guidance:              float32[1]
    input valid_text: runtime valid_text
    output sample: dtype[1, {v}, 64] select 0
    attention "transformer_blocks.*.attn": joint
        heads 24 head_dim 128 order (text, visual) text_mask false valid valid_text
    attention "single_transformer_blocks.*.attn": joint
        heads 24 head_dim 128 order (text, visual) text_mask false valid valid_text
}}

"""


def dsl(case: Case) -> str:
    """The model description whose denoiser is the case's module (the program bench builds only
    the denoiser; the host-overhead run also builds flux-tiny's encoders and VAE, widened)."""
    if case.family == "hunyuan":  # the real description with one block of each kind
        text = (REPO / "models" / "hunyuan-video.dsl").read_text()
        text = text.replace("num_layers: 20, num_single_layers: 40", "num_layers: 1, num_single_layers: 1")
        return re.sub(r"dtype    = \w+", f"dtype    = {DTYPES[case.dtype]}", text, count=1)
    cfg = ", ".join(f"{k}: {json.dumps(v)}" for k, v in FLUX_CONFIG.items())
    text = (REPO / "models" / "flux-tiny.dsl").read_text()
    a, b = text.index("denoiser transformer"), text.index("decoder vae")
    text = text[:a] + FLUX_DENOISER.format(config=cfg, v=(case.px // 16) ** 2, text=FLUX_TEXT) + text[b:]
    side = case.px // 16 * 4  # the tiny VAE (scale 2, packed 2x2) at the case's visual token count
    # the tiny encoders and VAE widened to what the real-width transformer reads (host-overhead run)
    for old, new in (("max_text = 32", f"max_text = {FLUX_TEXT}"),
                     ("dtype    = float32", f"dtype    = {DTYPES[case.dtype]}"),
                     ("height   = 32", f"height   = {side}"), ("width    = 32", f"width    = {side}"),
                     ("hidden_size: 32", "hidden_size: 768"), ("pooled: dtype[1, 32]", "pooled: dtype[1, 768]"),
                     ("d_model: 32", "d_model: 4096"), ("max_text, 32]", "max_text, 4096]"),
                     ("latent_channels: 4", "latent_channels: 16"), ("z: dtype[1, 4,", "z: dtype[1, 16,")):
        assert old in text, old  # flux-tiny.dsl changed: update this splice
        text = text.replace(old, new)
    return text


def checkpoint(case: Case, dest: Path) -> None:
    """Seeded random weights of the case's module, saved as a diffusers `transformer` folder."""
    import diffusers
    import torch

    torch.manual_seed(0)
    model = getattr(diffusers, case.class_name)(**case.config)
    model.to(getattr(torch, DTYPES[case.dtype])).save_pretrained(str(dest / "transformer"))


def eager_inputs(case: Case, dev) -> dict:
    """The keyword arguments the diffusers pipeline calls the module with (one request)."""
    import torch

    g, dt = torch.Generator().manual_seed(1), getattr(torch, DTYPES[case.dtype])
    rand = lambda *shape: torch.randn(*shape, generator=g).to(dev, dt)  # noqa: E731
    if case.family == "hunyuan":
        mask = (torch.arange(HUNYUAN_TEXT) < VALID_TEXT).to(dev, dt)[None]
        return dict(hidden_states=rand(1, *HUNYUAN_LATENT), timestep=torch.tensor([500.0], device=dev),
                    encoder_hidden_states=rand(1, HUNYUAN_TEXT, 4096), encoder_attention_mask=mask,
                    pooled_projections=rand(1, 768), guidance=torch.tensor([6000.0], device=dev))
    v, side = (case.px // 16) ** 2, case.px // 16
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(side * 1.0), torch.arange(side * 1.0),
                                         indexing="ij"), -1).reshape(v, 3)
    return dict(hidden_states=rand(1, v, 64), encoder_hidden_states=rand(1, FLUX_TEXT, 4096),
                pooled_projections=rand(1, 768), timestep=torch.tensor([0.5]).to(dev, dt),
                img_ids=img_ids.to(dev, dt), txt_ids=torch.zeros(FLUX_TEXT, 3).to(dev, dt),
                guidance=torch.tensor([3.5], device=dev))


def program_values(case: Case, kw: dict) -> dict:
    """`eager_inputs` by the program's IR input names: the key mask becomes the valid-key count."""
    values = {k: v for k, v in kw.items() if k not in ("encoder_attention_mask", "img_ids", "txt_ids")}
    if case.family == "flux":  # the host's RoPE tables (families/flux/host.py) in place of the ids
        from difflet.families.flux.host import rope_tables

        side = case.px // 16
        values["img_rope"], values["txt_rope"] = rope_tables(tuple(FLUX_CONFIG["axes_dims_rope"]), side, side,
                                                             FLUX_TEXT, kw["img_ids"].dtype, kw["txt_ids"].dtype)
    values["valid_text"] = VALID_TEXT if case.family == "hunyuan" else FLUX_TEXT
    return values
