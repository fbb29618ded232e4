"""HunyuanVideo codegen declarations: pipeline class, bounded attention, and the two program wrappers.

Invariants:
- The denoiser program takes `valid_text` (0-d int64) instead of a host mask: the wrapper builds
  `encoder_attention_mask = arange(T) < valid_text` inside the program and calls the stock
  forward, so the token refiner, its masked mean pooling and the blocks' key mask are diffusers'.
- The dual- and single-stream attention sites compute q/k/v exactly as diffusers'
  HunyuanVideoAttnProcessor2_0 and differ only in the attention call: the joint bounded op over
  [visual, text] keys with bounds [0, V + valid_text), where valid_text is read back from the key
  mask the model built (from valid_text, the same for every row) — softmax over the same keys as diffusers'
  masked SDPA. The token refiner's self-attention keeps diffusers' processor (the shared
  install_attention installs processors at joint sites only).
- Split HunyuanVideoTransformer3DModel: its IR input is the video latent, which the model patches
  itself, so the visual stream is sharded inside the model (transformer_blocks.0's input, the
  rope tables, proj_out's output) after the joint key mask is built over the full [V, T]; under
  SP the refined text is token-sharded where it enters transformer_blocks.0. The token refiner
  (context_embedder) stays replicated. The split attention is hunyuan_video/attention.py's.
- The Llama program returns hidden_states[-(SKIP_LAYERS + 1)] (the pipeline's num_hidden_layers_to_skip
  = 2) of an unmasked causal run over right-padded ids: causal attention and positions
  0..L-1 make every valid row independent of the padding after it.
"""
from __future__ import annotations

import torch

from difflet.codegen.joint_ops import joint_bounded_attention
from difflet.codegen.decl import BlockDecl, ClassDecl, ProbeDecl, SplitDecl
from difflet.families.hunyuan_video.joint import joint_out, joint_qkv, mask_valid_text
from difflet.codegen.probe_feature import FeatureProbe
from difflet.codegen.text_masks import causal_masks
from difflet.errors import DiffletError
from difflet.kernels.select import FUSED
from difflet.ir.nodes import Node, Op, RuntimeType

INDEX_EXTRAS: dict = {}  # HunyuanVideoPipeline has no optional components

SKIP_LAYERS = 2  # HunyuanVideoPipeline._get_llama_prompt_embeds(num_hidden_layers_to_skip=2)
DENOISER = "diffusers.HunyuanVideoTransformer3DModel"


class HunyuanVideoBoundedAttnProcessor:
    """Drop-in for HunyuanVideoAttnProcessor2_0 (visual-first joint sequence) on the bounded op."""

    kernel = FUSED  # the program's bounded-attention kernel: install_attention sets it (kernels/select.py)

    def __init__(self, text_len: int, text_first: bool = False) -> None:
        if text_first:
            raise DiffletError("HunyuanVideo's joint sequence is (visual, text)", where="order")
        self.text_len = text_len

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor = None,
                 attention_mask: torch.Tensor | None = None,
                 image_rotary_emb=None) -> torch.Tensor:
        text_len = encoder_hidden_states.shape[1] if encoder_hidden_states is not None else 0
        query, key, value = joint_qkv(attn, hidden_states, encoder_hidden_states, image_rotary_emb, text_len)
        out = joint_bounded_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                      text_len, mask_valid_text(attention_mask, text_len), text_first=False,
                                      kernel=self.kernel)
        if encoder_hidden_states is None:
            return out.transpose(1, 2).flatten(2, 3).to(query.dtype)
        return joint_out(attn, out, text_len, query.dtype)


class HunyuanVideoProgram(torch.nn.Module):
    """IR inputs in (any batch; valid_text a 0-d int64 shared by the rows), `sample` out."""

    def __init__(self, model: torch.nn.Module, node: Node) -> None:
        super().__init__()
        inputs = node.find(Op.INPUT)
        self.model = model
        self.names = [n.name for n in inputs]
        runtime = [n.name for n in inputs if isinstance(n.results[0].type, RuntimeType)]
        if "encoder_attention_mask" in self.names:
            raise DiffletError(f"denoiser {node.name!r}: encoder_attention_mask is built inside the "
                               "program from valid_text; drop that input", where=node.loc)
        if runtime != ["valid_text"]:
            raise DiffletError(f"denoiser {node.name!r} needs exactly one runtime input, valid_text "
                               f"(has {runtime})", where=node.loc)
        if len(node.find(Op.OUTPUT)) != 1:
            raise DiffletError(f"denoiser {node.name!r} has one output (sample)", where=node.loc)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor]:
        kwargs = dict(zip(self.names, inputs, strict=True))
        valid_text = kwargs.pop("valid_text")
        text = kwargs["encoder_hidden_states"]
        # the pipeline passes the tokenizer's mask cast to the transformer dtype; right padding
        mask = (torch.arange(text.shape[1], device=text.device) < valid_text).to(text.dtype)
        mask = mask[None].expand(text.shape[0], -1)  # every row of a batch: one valid_text
        out = self.model(**kwargs, encoder_attention_mask=mask, return_dict=False)[0]
        return (out,)


class LlamaHiddenStatesProgram(torch.nn.Module):
    """input_ids [1, L] -> hidden_states[-(SKIP_LAYERS + 1)] [1, L, H] (no KV cache, no mask)."""

    def __init__(self, model: torch.nn.Module, node: Node) -> None:
        super().__init__()
        self.model = model
        names = [n.name for n in node.find(Op.INPUT)]
        if names != ["input_ids"]:
            raise DiffletError(f"encoder {node.name!r} takes exactly input_ids, not {names}",
                               where=node.loc)

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor]:
        mask = causal_masks(self.model, input_ids, None)  # built here: no host read (text_masks.py)
        out = self.model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        return (out.hidden_states[-(SKIP_LAYERS + 1)],)


def _llama_program(model: torch.nn.Module, node: Node) -> torch.nn.Module:
    """The hidden-states program when the IR selects `hidden_states`, else the generic one."""
    from difflet.codegen.program_module import ProgramModule

    selects = [n.attrs.get("select") for n in node.find(Op.OUTPUT)]
    if selects == ["hidden_states"]:
        return LlamaHiddenStatesProgram(model, node)
    return ProgramModule(model, node)


class HunyuanVideoProbe(FeatureProbe):
    """HunyuanVideoTransformer3DModel up to the first double-stream block's norm1 output (its
    modulated visual input): x_embedder and the timestep/pooled-text/guidance embedding."""

    def __init__(self, model: torch.nn.Module, feature_shape: tuple[int, ...], inputs: list[str]) -> None:
        super().__init__(feature_shape, inputs, model.x_embedder.proj.weight.dtype)
        self.x_embedder, self.time_text_embed = model.x_embedder, model.time_text_embed
        self.norm1 = model.transformer_blocks[0].norm1

    def feature(self, named: dict[str, torch.Tensor]) -> torch.Tensor:
        temb = self.time_text_embed(named["timestep"], named["pooled_projections"], named.get("guidance"))[0]
        return self.norm1(self.x_embedder(named["hidden_states"]), emb=temb)[0]


def _split_processor(*args):
    # imported when a split is built: it pulls in torch.distributed, which unsplit programs never need
    from difflet.families.hunyuan_video.attention import HunyuanVideoSplitAttnProcessor

    return HunyuanVideoSplitAttnProcessor(*args)


CLASSES = {
    DENOISER: ClassDecl(
        processor=HunyuanVideoBoundedAttnProcessor, wrapper=HunyuanVideoProgram,
        split=SplitDecl(visual_inputs={}, visual_outputs={},  # a 5-d latent: sharded in the model
                        sp_entries=(),  # the text is SP-sharded where it enters the blocks (sp_inputs)
                        joint_prefixes=("single_transformer_blocks.",), processor=_split_processor,
                        stream_entries={"transformer_blocks.0": 1}, stream_exits={"proj_out": 1},
                        cp_tables={"rope": 0}, sp_inputs={"transformer_blocks.0": 1}),
        probe=ProbeDecl(inputs=("hidden_states", "timestep", "pooled_projections", "guidance"),
                        build=HunyuanVideoProbe),
        blocks=BlockDecl(stacks=("transformer_blocks", "single_transformer_blocks"),
                         outputs=("hidden_states", "encoder_hidden_states"), tail=("hidden_states",))),
    "transformers.LlamaModel": ClassDecl(wrapper=_llama_program),
}
