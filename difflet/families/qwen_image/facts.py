"""Qwen-Image's facts: every encoder reads the prompt inside the pipeline's template; true CFG; the
text config a description's shapes read from a Qwen2.5-VL config.json that has none
(`text_encoder_derived`)."""
from __future__ import annotations

from difflet.families.facts import FamilyFacts
from difflet.families.split_globs import MMDIT_COLUMN, MMDIT_ROW

DENOISER = "diffusers.QwenImageTransformer2DModel"
TEXT_ENCODER = "transformers.Qwen2_5_VLForConditionalGeneration"

# QwenImagePipeline.prompt_template_encode (tests/test_prompt_policy.py holds it equal to the pipeline's)
PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")


def text_encoder_derived(config: dict) -> dict:
    """`text_config` for a Qwen2.5-VL config.json saved flat (before transformers nested the text
    model's keys): Qwen2_5_VLConfig then builds its text config from the top-level keys, so
    `text_encoder.text_config.hidden_size` reads the top-level hidden_size. A config.json with a
    text_config (Qwen-Image's own) is read as it is."""
    if config.get("text_config") is not None or "hidden_size" not in config:
        return {}
    return {"text_config": {k: v for k, v in config.items() if k != "vision_config"}}


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
    split_built=(DENOISER,), probe_built=(DENOISER,), blocks_built=(DENOISER,), spmd_built=(DENOISER,),
    derived_config={TEXT_ENCODER: text_encoder_derived},
)
