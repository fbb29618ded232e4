"""HunyuanVideo's facts: the Llama reads the prompt inside the pipeline's template (the CLIP reads
it bare); embedded guidance unless a step says true_cfg; the fps `hunyuan_video.decode` declares."""
from __future__ import annotations

from difflet.families.facts import FamilyFacts, find_step, step_attr
from difflet.families.split_globs import dual_single_stream

DENOISER = "diffusers.HunyuanVideoTransformer3DModel"

DEFAULT_FPS = 15.0  # the model card's export_to_video(..., fps=15)
# HunyuanVideoPipeline's DEFAULT_PROMPT_TEMPLATE["template"] (diffusers imports torch; the test
# holds this copy equal to it)
PROMPT_TEMPLATE = (
    "<|start_header_id|>system<|end_header_id|>\n\nDescribe the video by detailing the following "
    "aspects: 1. The main content and theme of the video.2. The color, shape, size, texture, "
    "quantity, text, and spatial relationships of the objects.3. Actions, events, behaviors "
    "temporal relationships, physical movement changes of the objects.4. background environment, "
    "light, style and atmosphere.5. camera angles, movements, and transitions used in the video:"
    "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>")


def _llama(module) -> frozenset[str]:
    """The first encoder of the encode step (its Llama)."""
    step = find_step(module, "hunyuan_video.encode_prompt")
    return frozenset({str(step.args[0])}) if step is not None and step.args else frozenset()


def fps(module) -> float:
    return float(step_attr(module, "hunyuan_video.decode", "fps", DEFAULT_FPS))


FACTS = FamilyFacts(
    description=lambda ckpt: "hunyuan-video",
    prompt_text=lambda prompt, templated: PROMPT_TEMPLATE.format(prompt) if templated else prompt,
    templated=_llama, fps=fps, default_guidance="embedded",
    rules={DENOISER: dict(dual_single_stream(),
                          probe=("x_embedder", "time_text_embed", "transformer_blocks.0.norm1"))},
    split_built=(DENOISER,), probe_built=(DENOISER,), blocks_built=(DENOISER,),
)
