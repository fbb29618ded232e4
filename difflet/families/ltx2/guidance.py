"""LTX-2's perturbed guidance passes inside the one transformer program (private to ltx2/programs.py).

LTX2Pipeline's default guidance (diffusers pipelines/ltx2/pipeline_ltx2.py `__call__`:
stg_scale=1, modality_scale=3) runs, besides CFG's two passes, two more passes of the same
transformer, each with one change (diffusers models/transformers/transformer_ltx2.py):
- spatio-temporal guidance (STG): at the blocks in `spatio_temporal_guidance_blocks`, the video
  and audio self-attention (attn1, audio_attn1) return `to_out(to_v(x))` instead of attention
  (LTX2PerturbedAttnProcessor with an all-zero perturbation mask). Only a transformer whose config
  says `perturbed_attn` has that processor; without it the blocks ignore the mask and the STG
  pass computes exactly the conditional pass (ltx2/denoise.py then skips it: its delta is 0).
- modality isolation (`isolate_modalities=True`): no block adds its audio-to-video or
  video-to-audio attention residual.

Here the passes are one program with a runtime input `guidance_pass` (PLAIN, STG, ISOLATED), so
the weights exist once (trn2 compiles no control flow: the passes are selects, not branches).

Invariants:
- PLAIN computes the module's own outputs bit for bit: each select returns the module's value.
- ISOLATED replaces the cross-modal attention outputs by zeros, so the block's `h + gate * 0` is
  h: the residual diffusers skips (the attention still runs and is discarded).
- STG replaces the declared blocks' self-attention outputs by `to_out(to_v(x))` of the same
  input through the same (possibly split) linears: diffusers' value path. LTX-2.0's blocks have
  no gated heads; a gated STG block is refused.
- The switch holds the pass value only during a forward call (hooks read it; it is no buffer).
"""
from __future__ import annotations

import torch

from difflet.errors import DiffletError
from difflet.families.ltx2.facts import perturbable, stg_blocks
from difflet.ir.nodes import Node

PLAIN, STG, ISOLATED = 0, 1, 2
INPUT = "guidance_pass"
CROSS_MODAL = ("audio_to_video_attn", "video_to_audio_attn")
SELF = ("attn1", "audio_attn1")


class PassSwitch:
    """The pass value of the forward call in progress, read by the hooks `install` registers."""

    def __init__(self) -> None:
        self.value: torch.Tensor | None = None

    def current(self) -> torch.Tensor:
        if self.value is None:
            raise RuntimeError("a guidance-pass hook ran outside TransformerProgram.forward")
        return self.value


def _isolate(switch: PassSwitch):
    def hook(module, args, output):
        return torch.where(switch.current() == ISOLATED, torch.zeros_like(output), output)
    return hook


def _perturb(switch: PassSwitch):
    def hook(module, args, kwargs, output):
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        value_path = module.to_out[1](module.to_out[0](module.to_v(x)))
        return torch.where(switch.current() == STG, value_path, output)
    return hook


def install(model: torch.nn.Module, node: Node) -> PassSwitch:
    """Register the pass hooks on the transformer's blocks (once per model); returns the switch."""
    switch = model.__dict__.get("_difflet_pass_switch")
    if switch is not None:
        return switch
    switch = model.__dict__["_difflet_pass_switch"] = PassSwitch()
    blocks = model.transformer_blocks
    for block in blocks:
        for name in CROSS_MODAL:
            getattr(block, name).register_forward_hook(_isolate(switch))
    if not perturbable(node.attrs.get("config")):
        return switch
    for index in stg_blocks(node):
        if not 0 <= index < len(blocks):
            raise DiffletError(f"options.stg_blocks names block {index}; the transformer has {len(blocks)}",
                               where=node.loc)
        for name in SELF:
            attn = getattr(blocks[index], name)
            if getattr(attn, "to_gate_logits", None) is not None:
                raise DiffletError(f"STG at block {index}: gated self-attention (LTX-2.3) is not served",
                                   where=node.loc)
            attn.register_forward_hook(_perturb(switch), with_kwargs=True)
    return switch
