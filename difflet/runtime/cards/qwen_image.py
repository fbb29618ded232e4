"""Qwen-Image's card: every encoder reads the prompt inside the pipeline's template; true CFG."""
from __future__ import annotations

from difflet.runtime.cards import FamilyCard

# QwenImagePipeline.prompt_template_encode (copy of codegen/family/qwen_image.PROMPT_TEMPLATE,
# which imports torch; tests/test_prompt_policy.py holds them equal)
PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")


def _every_encoder(module) -> frozenset[str]:
    return frozenset(c.name for c in module.components("encoder"))


CARD = FamilyCard(prompt_text=lambda prompt, templated: PROMPT_TEMPLATE.format(prompt) if templated else prompt,
                  templated=_every_encoder, default_guidance="true_cfg")
