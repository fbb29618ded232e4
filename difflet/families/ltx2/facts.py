"""LTX-2's facts: stripped prompts, cfg guidance, the frame rate `ltx2.prepare_latents` declares."""
from __future__ import annotations

from difflet.families.facts import FamilyFacts, step_attr
from difflet.families.split_globs import ATTN_COL

DENOISER = "diffusers.LTX2VideoTransformer3DModel"
_ATTN = ("attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")

FRAME_RATE = 24.0  # LTX2Pipeline's default frame_rate


def frame_rate(module) -> float:
    return float(step_attr(module, "ltx2.prepare_latents", "frame_rate", FRAME_RATE))


FACTS = FamilyFacts(
    description=lambda ckpt: "ltx2",
    prompt_text=lambda prompt, templated: prompt.strip(), default_guidance="cfg", fps=frame_rate,
    rules={DENOISER: {
        "column": tuple(f"transformer_blocks.*.{a}.{p}" for a in _ATTN for p in ATTN_COL)
        + ("transformer_blocks.*.ff.net.0.proj", "transformer_blocks.*.audio_ff.net.0.proj"),
        "row": tuple(f"transformer_blocks.*.{a}.to_out.0" for a in _ATTN)
        + ("transformer_blocks.*.ff.net.2", "transformer_blocks.*.audio_ff.net.2"),
        "row_segments": {},
        "heads_norm_across": True,
        "probe": ("proj_in", "time_embed", "transformer_blocks.0.scale_shift_table", "transformer_blocks.0.norm1"),
        "cfg_branch": ("encoder_hidden_states", "audio_encoder_hidden_states"),
    }},
    split_built=(DENOISER,), probe_built=(DENOISER,),
)
