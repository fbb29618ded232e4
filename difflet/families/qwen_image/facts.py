"""Qwen-Image's facts: every encoder reads the prompt inside the pipeline's template; true CFG."""
from __future__ import annotations

from difflet.families.facts import FamilyFacts
from difflet.families.split_globs import MMDIT_COLUMN, MMDIT_ROW

DENOISER = "diffusers.QwenImageTransformer2DModel"

# QwenImagePipeline.prompt_template_encode (tests/test_prompt_policy.py holds it equal to the pipeline's)
PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")


def _every_encoder(module) -> frozenset[str]:
    return frozenset(c.name for c in module.components("encoder"))


FACTS = FamilyFacts(
    description=lambda ckpt: "qwen-image",
    prompt_text=lambda prompt, templated: PROMPT_TEMPLATE.format(prompt) if templated else prompt,
    templated=_every_encoder, default_guidance="true_cfg",
    rules={DENOISER: {
        "column": MMDIT_COLUMN + ("transformer_blocks.*.img_mlp.net.0.proj", "transformer_blocks.*.txt_mlp.net.0.proj"),
        "row": MMDIT_ROW + ("transformer_blocks.*.img_mlp.net.2", "transformer_blocks.*.txt_mlp.net.2"),
        "row_segments": {},
        "column_gather": ("transformer_blocks.*.img_mod.1", "transformer_blocks.*.txt_mod.1"),
        "heads_norm_across": False,
        "probe": ("img_in", "time_text_embed", "transformer_blocks.0.img_mod", "transformer_blocks.0.img_norm1"),
        "cfg_branch": ("encoder_hidden_states", "valid_text"),
    }},
    split_built=(DENOISER,), probe_built=(DENOISER,), spmd_built=(DENOISER,),
)
