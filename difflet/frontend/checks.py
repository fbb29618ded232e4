"""Shape checks: a component's declared shapes against its config and the serving profile.

Invariants:
- A check runs only when the facts it needs are present (inline configs, the profile's
  height/width/max_text); a description that passes every check that applies is consistent.
- Independently derived from configs, never from the DSL's own shape expressions:
  pixels per latent token = decoder spatial scale (2 ** (len(block_out_channels) - 1)) times the
  latent pack factor sqrt(denoiser in_channels / decoder latent_channels).
- Channels of a latent are dim 1 for a 5-D video latent [B, C, F, H, W] (unpatchified: the
  transformer patchifies inside) and the last dim for a packed token latent [B, N, C].
- An attention site that involves another stream (e.g. LTX-2 `audio`) is checked against
  that stream's config keys (`audio_num_attention_heads`, `audio_attention_head_dim`) when
  the config has them; otherwise against the main keys.
- Every failure names the offending input/output declaration.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from difflet.frontend import ast
from difflet.frontend.shapes import Source, resolved
from difflet.ir.nodes import Attrs

TEXT_DIM_KEYS = ("joint_attention_dim", "text_embed_dim", "text_dim", "caption_channels")


def _tensor_inputs(comp: ast.ComponentDecl, shapes: Mapping[str, tuple[int, ...]]):
    return [(i, shapes[i.name]) for i in comp.inputs if i.tensor is not None]


def latent_channels(shape: tuple[int, ...]) -> int:
    """Channel count of a latent: dim 1 of a 5-D [B, C, F, H, W], else the last dim."""
    return shape[1] if len(shape) == 5 else shape[-1]


def pixels_per_token(denoiser_cfg: Attrs, decoder_cfg: Attrs) -> int | None:
    """Pixel edge covered by one latent token, or None when the configs do not say."""
    blocks = decoder_cfg.get("block_out_channels")
    latent = decoder_cfg.get("latent_channels")
    in_ch = denoiser_cfg.get("in_channels")
    if not blocks or not latent or not in_ch or in_ch % latent:
        return None
    pack = math.isqrt(in_ch // latent)
    if pack * pack != in_ch // latent:
        return None
    return 2 ** (len(blocks) - 1) * pack


def check_denoiser(src: Source, comp: ast.ComponentDecl, config: Attrs | None,
                   shapes: Mapping[str, tuple[int, ...]], decoder_cfg: Attrs | None,
                   profile: Mapping[str, Any]) -> None:
    """Latent tokens vs profile, channels vs in_channels, text length/dim, output channels."""
    inputs = _tensor_inputs(comp, shapes)
    if not inputs:
        return
    latent, latent_shape = inputs[0]
    cfg = config or Attrs()
    in_ch = cfg.get("in_channels")
    if in_ch is not None and latent_channels(latent_shape) != in_ch:
        raise src.error(f"denoiser latent input {latent.name!r} has {latent_channels(latent_shape)} "
                        f"channels but "
                        f"the config's in_channels is {in_ch}", latent.span)
    ps = pixels_per_token(cfg, decoder_cfg) if decoder_cfg is not None else None
    if (ps is not None and len(latent_shape) == 3 and "frames" not in profile
            and isinstance(profile.get("height"), int) and isinstance(profile.get("width"), int)):
        h, w = profile["height"], profile["width"]
        if h % ps or w % ps:
            raise src.error(f"profile {h}x{w} is not a multiple of {ps} pixels per latent token",
                            latent.span)
        want, implied = (h // ps) * (w // ps), f"(height/{ps})*(width/{ps})"
        image = [resolved(profile, k) if k in profile else None for k in ("image_width", "image_height")]
        if all(isinstance(x, int) and not isinstance(x, bool) for x in image):
            # an input image compiled at its own size joins the visual tokens (FLUX.1 Kontext)
            want += (image[1] // ps) * (image[0] // ps)
            implied += f" + (image_height/{ps})*(image_width/{ps})"
        if latent_shape[1] != want:
            raise src.error(f"denoiser latent input {latent.name!r} has {latent_shape[1]} tokens but "
                            f"the profile implies {implied} = {want}", latent.span)
    for decl, shape in inputs:
        if decl.name == "encoder_hidden_states":
            _check_text(src, decl, shape, cfg, profile)
        if decl.name == "pooled_projections" and cfg.get("pooled_projection_dim") is not None:
            if shape[-1] != cfg["pooled_projection_dim"]:
                raise src.error(f"pooled input has dim {shape[-1]} but the config's "
                                f"pooled_projection_dim is {cfg['pooled_projection_dim']}", decl.span)
    if comp.outputs and in_ch is not None:
        out, out_shape = comp.outputs[0], shapes[comp.outputs[0].name]
        if len(out_shape) == 5:
            # a video output is unpatchified in the model: its channels are out_channels
            want, why = cfg.get("out_channels") or in_ch, "out_channels"
        else:
            patch = cfg.get("patch_size", 1)
            patch = patch if isinstance(patch, int) else 1
            want, why = patch * patch * (cfg.get("out_channels") or in_ch), "patch_size**2 * out_channels"
        if latent_channels(out_shape) != want:
            raise src.error(f"denoiser output {out.name!r} has {latent_channels(out_shape)} channels but "
                            f"the config implies {why} = {want}", out.span)


def _check_text(src: Source, decl: ast.InputDecl, shape: tuple[int, ...], cfg: Attrs,
                profile: Mapping[str, Any]) -> None:
    max_text = profile.get("max_text")
    if isinstance(max_text, int) and len(shape) >= 2 and shape[-2] != max_text:
        raise src.error(f"text input {decl.name!r} has {shape[-2]} tokens but max_text is {max_text}",
                        decl.span)
    for key in TEXT_DIM_KEYS:
        if cfg.get(key) is not None:
            if shape[-1] != cfg[key]:
                raise src.error(f"text input {decl.name!r} has dim {shape[-1]} but the config's "
                                f"{key} is {cfg[key]}", decl.span)
            break


def check_decoder(src: Source, comp: ast.ComponentDecl, config: Attrs | None,
                  shapes: Mapping[str, tuple[int, ...]]) -> None:
    """The latent input's channel dim (dim 1) must equal the config's latent_channels, times the
    patch area when the config states a 2-D `patch_size` (a VAE decoding patchified latents:
    AutoencoderKLFlux2)."""
    inputs = _tensor_inputs(comp, shapes)
    config = config or Attrs()
    latent, patch = config.get("latent_channels"), config.get("patch_size")
    if latent is not None and isinstance(patch, (list, tuple)) and len(patch) == 2:
        latent, why = latent * patch[0] * patch[1], f"latent_channels x patch area is {latent} x {patch[0] * patch[1]}"
    else:
        why = f"latent_channels is {latent}"
    if inputs and latent is not None and len(inputs[0][1]) >= 2 and inputs[0][1][1] != latent:
        decl, shape = inputs[0]
        raise src.error(f"decoder input {decl.name!r} has {shape[1]} channels but the config's {why}",
                        decl.span)


def check_attention(src: Source, site: ast.AttentionDecl, values: Mapping[str, Any],
                    config: Attrs | None) -> None:
    """Declared heads/head_dim must match num_attention_heads/attention_head_dim when given.

    A site whose order names another stream with its own keys (`<stream>_num_attention_heads`,
    e.g. LTX-2 audio, also the audio<->video cross sites, which run at the audio width) is
    checked against that stream's keys.
    """
    cfg = config or Attrs()
    spans = {key: span for key, _, span in site.fields}
    prefix = ""
    order = values.get("order") or ()
    for stream in order if isinstance(order, (tuple, list)) else ():
        if stream not in ("visual", "text") and f"{stream}_num_attention_heads" in cfg:
            prefix = f"{stream}_"
            break
    for field, key in (("heads", "num_attention_heads"), ("head_dim", "attention_head_dim")):
        key = prefix + key
        want = cfg.get(key)
        if isinstance(want, int) and values[field] != want:
            raise src.error(f"attention site {site.pattern!r} declares {field} {values[field]} but "
                            f"the config's {key} is {want}", spans[field])


def check_config_keys(src: Source, known, comp: ast.ComponentDecl) -> None:
    """Every stated config key is a parameter of the class (`known`; None: not introspectable)."""
    for entry in comp.config.entries:
        if known is not None and entry.key not in known:
            raise src.error(f"{comp.qualname} has no config parameter {entry.key!r}", entry.span)


def check_options(src: Source, known: tuple[str, ...], comp: ast.ComponentDecl) -> None:
    """Every `options {...}` key is one the class's family declares (FamilyFacts.options)."""
    for entry in comp.options.entries:
        if entry.key not in known:
            said = ", ".join(known) if known else "none"
            raise src.error(f"{comp.qualname} has no option {entry.key!r} (its family declares: {said})",
                            entry.span)
