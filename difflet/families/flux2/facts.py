"""FLUX.2 [klein]'s facts: the Qwen3 encoder reads the prompt in its tokenizer's chat template;
true CFG with an empty negative prompt on the base checkpoints (two passes), none on the
step-distilled ones (one pass); images. Its step-caching probe is built; split (beyond cfg2's
unsplit groups), block-mode and neuron SPMD programs are not yet.
"""
from __future__ import annotations

import json
from pathlib import Path

from difflet.families.facts import FamilyFacts
from difflet.families.split_globs import MMDIT_COLUMN, MMDIT_ROW, paths

DENOISER = "diffusers.Flux2Transformer2DModel"
TEXT_ENCODER = "transformers.Qwen3ForCausalLM"

# Flux2KleinPipeline.encode_prompt's default `text_encoder_out_layers` (pipeline_flux2_klein.py):
# the hidden states stacked, per token, into the transformer's text features
TEXT_LAYERS = (9, 18, 27)

DEFAULT_NEGATIVE_PROMPT = ""  # Flux2KleinPipeline.__call__ encodes "" for the unconditional pass

# Qwen3's chat template (the checkpoint tokenizer's chat_template.jinja) rendered for one user
# message with add_generation_prompt and enable_thinking=False, as _get_qwen3_prompt_embeds calls it;
# the host renders the tokenizer's own template, admission counts this (tests/test_flux2.py: equal)
PROMPT_TEMPLATE = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def description(ckpt) -> str:
    """flux2-klein-4b.dsl for a step-distilled checkpoint (model_index.json `is_distilled`: 4 steps,
    no CFG), else flux2-klein-base-4b.dsl (50 steps, CFG 4.0)."""
    index = json.loads((Path(ckpt) / "model_index.json").read_text())
    return "flux2-klein-4b" if index.get("is_distilled", False) else "flux2-klein-base-4b"


def _every_encoder(module) -> frozenset[str]:
    return frozenset(c.name for c in module.components("encoder"))


# Flux2Transformer2DModel's linears (transformer_flux2.py): dual-stream attention as FLUX.1's,
# SwiGLU feed-forwards (linear_in = [gate | up], linear_out), single-stream blocks with one fused
# [q | k | v | mlp] projection and a fused [attention, mlp] output; modulation is global (three
# linears outside the blocks), so no per-block AdaLN linear exists to gather. The planner and
# the memory model read these; codegen builds no TP/SP/CP program of this class yet (split_built).
RULES = {
    "column": MMDIT_COLUMN + paths("transformer_blocks.*", ("ff.linear_in", "ff_context.linear_in"))
    + ("single_transformer_blocks.*.attn.to_qkv_mlp_proj",),
    "row": MMDIT_ROW + paths("transformer_blocks.*", ("ff.linear_out", "ff_context.linear_out")),
    "row_segments": {"single_transformer_blocks.*.attn.to_out": ("attn", "mlp")},
    "column_gather": (),
    "heads_norm_across": False,
    "probe": ("x_embedder", "time_guidance_embed", "double_stream_modulation_img", "transformer_blocks.0.norm1"),
    "cfg_branch": ("encoder_hidden_states",),
}

FACTS = FamilyFacts(
    description=description,
    prompt_text=lambda prompt, templated: PROMPT_TEMPLATE.format(prompt) if templated else prompt,
    templated=_every_encoder, default_guidance="cfg", rules={DENOISER: RULES}, probe_built=(DENOISER,),
)
