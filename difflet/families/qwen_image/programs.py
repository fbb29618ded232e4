"""Qwen-Image codegen declarations: QwenImagePipeline checkpoints, the text-encoder program, a tiny tokenizer.

Invariants:
- The text-encoder program takes padded input_ids [1, L] (static L = max_text + template) and
  returns the LAST DECODER LAYER's hidden states [1, L, D] (`hidden_states[-1]` of the model run
  with output_hidden_states, before the final norm), exactly what QwenImagePipeline reads. It runs
  the language model alone (text-only: the vision tower and lm_head never run) with no attention
  mask: the model is causal and the host pads on the right, so a valid position never sees
  padding, and text-only position ids are 0..L-1 with or without the mask. The host keeps the
  valid rows; the padding rows are garbage by design and never read.
- The denoiser program masks text padding from the runtime valid_text inside the program
  (qwen_image/attention.py's processor, declared in CLASSES below), which also installs
  its static RoPE tables as real buffers (`install_static_rope`), in world-1 and split programs.
- The tiny tokenizer splits the chat template into exactly as many tokens as Qwen2Tokenizer
  does (34 before the prompt), so the pipeline's fixed drop index means the same thing.
"""
from __future__ import annotations

from pathlib import Path

import torch

from difflet.codegen.decl import BlockDecl, ClassDecl, ProbeDecl, SplitDecl
from difflet.codegen.probe_feature import FeatureProbe
from difflet.families.qwen_image.attention import QwenBoundedAttnProcessor, QwenSplitAttnProcessor
from difflet.errors import DiffletError
from difflet.families.qwen_image.facts import PROMPT_TEMPLATE
from difflet.ir.nodes import Node, Op

INDEX_EXTRAS: dict = {}  # QwenImagePipeline has no optional components

TEMPLATE_START = 34  # QwenImagePipeline.prompt_template_encode_start_idx


class QwenTextEncoderProgram(torch.nn.Module):
    """Qwen2.5-VL text path -> hidden_states[-1] (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, node: Node) -> None:
        super().__init__()
        outputs = node.find(Op.OUTPUT)
        inputs = [n.name for n in node.find(Op.INPUT)]
        if inputs != ["input_ids"] or len(outputs) != 1 or outputs[0].attrs.get("select") != "hidden_states":
            raise DiffletError(f"text encoder {node.name!r}: Qwen2.5-VL programs take `input_ids` and give "
                               f"one output select \"hidden_states\" (got inputs {inputs})", where=node.loc)
        self.language_model = model.model.language_model

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor]:
        out = self.language_model(input_ids=input_ids, use_cache=False, output_hidden_states=True)
        return (out.hidden_states[-1],)


class QwenImageProbe(FeatureProbe):
    """QwenImageTransformer2DModel up to the first block's img_modulated (the attention's visual
    input): img_in, the timestep embedding, img_mod's first half and img_norm1. It reads no text:
    the visual stream's modulation depends on the latents and the timestep only."""

    def __init__(self, model: torch.nn.Module, feature_shape: tuple[int, ...], inputs: list[str]) -> None:
        super().__init__(feature_shape, inputs, model.img_in.weight.dtype)
        if model.config.get("zero_cond_t") or model.config.get("use_additional_t_cond"):
            raise DiffletError("the Qwen-Image probe covers transformers without zero_cond_t / additional "
                               "t_cond (Qwen-Image's own); this config sets one", where="--probe")
        self.img_in, self.time_text_embed = model.img_in, model.time_text_embed
        self.block = model.transformer_blocks[0]

    def feature(self, named: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = self.img_in(named["hidden_states"])
        temb = self.time_text_embed(named["timestep"].to(hidden.dtype), hidden)
        mod1 = self.block.img_mod(temb).chunk(2, dim=-1)[0]  # norm1's shift, scale, gate
        return self.block._modulate(self.block.img_norm1(hidden), mod1)[0]


def write_tokenizer(comp: Node, config: dict, tokenizer_attrs, dest: Path) -> bool:
    """A word-level tokenizer shaped like Qwen2Tokenizer: chat special tokens, newlines as tokens,
    no added bos/eos, right padding with <|endoftext|> (the text config's pad id)."""
    from tokenizers import Regex, pre_tokenizers

    from difflet.codegen.tiny_tokenizers import CAPTION_WORDS, chat_vocab, save_word_level

    text = config.get("text_config", config)
    vocab_size, pad = int(text["vocab_size"]), int(text.get("pad_token_id") or 0)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    words = ["\n", *PROMPT_TEMPLATE.replace("{}", " ").replace("<|im_start|>", " ")
             .replace("<|im_end|>", " ").replace(",", " , ").replace(":", " : ").lower().split(),
             *CAPTION_WORDS]
    vocab = chat_vocab(vocab_size, pad, specials, words, where=comp.loc if comp is not None else None)
    # keep "\n" as a token (Qwen's BPE does): the template is then 34 tokens before the prompt
    split = pre_tokenizers.Split(Regex(r"\n|\w+|[^\w\s]+"), behavior="removed", invert=True)
    save_word_level(vocab, dest, unk="<unk>", pre_tokenizer=split,
                    model_max_length=int(tokenizer_attrs["max_length"]), pad_token="<|endoftext|>",
                    eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>", "<|im_end|>"],
                    padding_side="right")
    return True


CLASSES = {
    "transformers.Qwen2_5_VLForConditionalGeneration": ClassDecl(wrapper=QwenTextEncoderProgram,
                                                                 write_tokenizer=write_tokenizer),
    "diffusers.QwenImageTransformer2DModel": ClassDecl(
        processor=QwenBoundedAttnProcessor,  # its prepare_model installs the static RoPE tables
        split=SplitDecl(visual_inputs={"hidden_states": 1}, visual_outputs={"sample": 1},
                        sp_entries=("txt_in", "img_in"),
                        joint_prefixes=(),  # double-stream only: no linear sees the joint sequence
                        processor=QwenSplitAttnProcessor),
        probe=ProbeDecl(inputs=("hidden_states", "timestep"), build=QwenImageProbe),
        blocks=BlockDecl(stacks=("transformer_blocks",), outputs=("encoder_hidden_states", "hidden_states"),
                         tail=("hidden_states",))),
}
