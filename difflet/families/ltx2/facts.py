"""LTX-2's facts: stripped prompts, cfg guidance, the frame rate `ltx2.prepare_latents` declares, and
the keys a description's shapes read that the configs of LTX2Pipeline's decoders do not state
(`video_vae_derived`, `audio_vae_derived`, `vocoder_derived`)."""
from __future__ import annotations

import math
from typing import Any, Mapping

from difflet.families.facts import FamilyFacts, step_attr
from difflet.families.split_globs import ATTN_COL

DENOISER = "diffusers.LTX2VideoTransformer3DModel"
_ATTN = ("attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")

FRAME_RATE = 24.0  # LTX2Pipeline's default frame_rate


def frame_rate(module) -> float:
    return float(step_attr(module, "ltx2.prepare_latents", "frame_rate", FRAME_RATE))


VIDEO_VAE = "diffusers.AutoencoderKLLTX2Video"
AUDIO_VAE = "diffusers.AutoencoderKLLTX2Audio"
VOCODER = "diffusers.pipelines.ltx2.vocoder.LTX2Vocoder"
# the classes' __init__ defaults for the keys the derived numbers depend on
VIDEO_VAE_DEFAULTS = {"patch_size": 4, "patch_size_t": 1, "layers_per_block": [4, 6, 6, 2, 2],
                      "spatio_temporal_scaling": [True, True, True, True]}
AUDIO_LATENT_DOWNSAMPLE = 4  # autoencoder_kl_ltx2_audio.LATENT_DOWNSAMPLE_FACTOR: a constant of the class
VOCODER_UPSAMPLE_FACTORS = [6, 5, 2, 2, 2]


def _stated(config: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    return {**defaults, **{k: v for k, v in config.items() if v is not None}}


def video_vae_derived(config: Mapping[str, Any]) -> dict[str, int]:
    """AutoencoderKLLTX2Video's `spatial_compression_ratio` / `temporal_compression_ratio` as its
    __init__ computes them when the config leaves them null: patch_size (patch_size_t) times 2 **
    the encoder's spatio-temporal scalings (a bool: one per encoder block but the last). A stated
    ratio (LTX-2's config.json states 32 and 8) is never replaced (with_derived)."""
    cfg = _stated(config, VIDEO_VAE_DEFAULTS)
    scaling = cfg["spatio_temporal_scaling"]
    if isinstance(scaling, bool):
        scaling = [scaling] * (len(cfg["layers_per_block"]) - 1)
    scale = 2 ** sum(bool(s) for s in scaling)
    return {"spatial_compression_ratio": int(cfg["patch_size"]) * scale,
            "temporal_compression_ratio": int(cfg["patch_size_t"]) * scale}


def audio_vae_derived(config: Mapping[str, Any]) -> dict[str, int]:
    """AutoencoderKLLTX2Audio's fixed 4x `temporal_compression_ratio` and `mel_compression_ratio`
    (what LTX2Pipeline reads from the model), and `decoded_frames_trim`: its decoder turns L latent
    frames into L * 4 mel frames less 3 whenever causality_axis is not null (its test; "none"
    included, and the class refuses null today), so mel frames = audio * temporal_compression_ratio
    - decoded_frames_trim."""
    causal = config.get("causality_axis", "height") is not None
    return {"temporal_compression_ratio": AUDIO_LATENT_DOWNSAMPLE, "mel_compression_ratio": AUDIO_LATENT_DOWNSAMPLE,
            "decoded_frames_trim": AUDIO_LATENT_DOWNSAMPLE - 1 if causal else 0}


def vocoder_derived(config: Mapping[str, Any]) -> dict[str, int]:
    """LTX2Vocoder's `total_upsample_factor`: waveform samples per mel frame, prod(upsample_factors)."""
    factors = config.get("upsample_factors")
    return {"total_upsample_factor": math.prod(int(f) for f in (factors or VOCODER_UPSAMPLE_FACTORS))}


def profile_derived(profile: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """`audio`, the latent audio frames LTX2Pipeline makes for `frames` video frames at the default
    frame rate: round(frames / frame_rate * sample_rate / mel_hop_length / 4) (its __call__)."""
    audio_vae = configs.get(AUDIO_VAE)
    if "frames" not in profile or not audio_vae or not audio_vae.get("sample_rate") or not audio_vae.get("mel_hop_length"):
        return {}
    per_second = float(audio_vae["sample_rate"]) / float(audio_vae["mel_hop_length"]) / AUDIO_LATENT_DOWNSAMPLE
    return {"audio": round(int(profile["frames"]) / FRAME_RATE * per_second)}


def stg_blocks(node) -> tuple[int, ...]:
    """The blocks the STG pass perturbs: the transformer's `options { stg_blocks: [...] }`."""
    options = node.attrs.get("options") or {}
    return tuple(int(b) for b in (options.get("stg_blocks") or ()))


def perturbable(config) -> bool:
    """Whether the transformer's blocks honour STG: diffusers builds LTX2PerturbedAttnProcessor
    only for `perturbed_attn` (LTX2VideoTransformerBlock.__init__); LTX-2.0's config leaves it false."""
    return bool((config or {}).get("perturbed_attn", False))


def extra_guidance(module) -> tuple[tuple[str, bool], ...]:
    """LTX2Pipeline's STG and modality-isolation terms the description's denoise step asks for
    (video values); STG's pass runs only for a transformer that is `perturbable`."""
    from difflet.families.facts import find_step, guidance_spec
    from difflet.ir.nodes import Op

    step = find_step(module, "ltx2.denoise")
    if step is None:
        return ()
    spec = guidance_spec(step, "cfg")
    stg, modality = float(spec.get("stg_scale", 0.0)), float(spec.get("modality_scale", 1.0))
    transformer = next((c for c in module.find(Op.COMPONENT) if c.attrs.get("class") == DENOISER), None)
    terms = []
    if stg > 0:
        terms.append((f"STG {stg}", transformer is not None and perturbable(transformer.attrs.get("config"))))
    if modality > 1:
        terms.append((f"modality {modality}", True))
    return tuple(terms)


FACTS = FamilyFacts(
    description=lambda ckpt: "ltx2",
    prompt_text=lambda prompt, templated: prompt.strip(), default_guidance="cfg", fps=frame_rate,
    derived_profile=profile_derived,
    rules={DENOISER: {
        "column": tuple(f"transformer_blocks.*.{a}.{p}" for a in _ATTN for p in ATTN_COL)
        + ("transformer_blocks.*.ff.net.0.proj", "transformer_blocks.*.audio_ff.net.0.proj"),
        "row": tuple(f"transformer_blocks.*.{a}.to_out.0" for a in _ATTN)
        + ("transformer_blocks.*.ff.net.2", "transformer_blocks.*.audio_ff.net.2"),
        "row_segments": {},
        "heads_norm_across": True,
        "probe": ("proj_in", "time_embed", "transformer_blocks.0.scale_shift_table", "transformer_blocks.0.norm1"),
        # guidance_pass: a cfg2 call pairs the STG and the modality-isolated pass (ltx2/denoise.py)
        "cfg_branch": ("encoder_hidden_states", "audio_encoder_hidden_states", "guidance_pass"),
    }},
    # stg_blocks: the blocks LTX2Pipeline's STG pass perturbs (ltx2/guidance.py)
    options={DENOISER: ("stg_blocks",)}, extra_guidance=extra_guidance,
    split_built=(DENOISER,), probe_built=(DENOISER,), blocks_built=(DENOISER,),
    derived_config={VIDEO_VAE: video_vae_derived, AUDIO_VAE: audio_vae_derived, VOCODER: vocoder_derived},
)
