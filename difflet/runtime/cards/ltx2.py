"""LTX-2's card: stripped prompts, cfg guidance, the frame rate `ltx2.prepare_latents` declares."""
from __future__ import annotations

from difflet.runtime.cards import FamilyCard, step_attr

FRAME_RATE = 24.0  # LTX2Pipeline's default frame_rate


def frame_rate(module) -> float:
    return float(step_attr(module, "ltx2.prepare_latents", "frame_rate", FRAME_RATE))


CARD = FamilyCard(prompt_text=lambda prompt, templated: prompt.strip(), default_guidance="cfg",
                  fps=frame_rate)
