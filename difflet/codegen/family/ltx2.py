"""LTX-2 codegen hooks: LTX2Pipeline checkpoints and the program wrappers of its components.

Invariants:
- Every wrapper takes the component's IR inputs positionally (IR order) and returns its IR outputs,
  computing exactly what LTX2Pipeline does around that module call (operation for operation).
- The prompt's padding never crosses as a mask: the Gemma tokenizer pads LEFT (the pipeline forces
  it), so the valid tokens are the last `valid_text` positions; the encoder and the connectors build
  that mask inside the program from the runtime value `valid_text` (a 0-d int64 program input,
  range-checked by the runtime before every call).
- The connectors replace the padding with learnable registers, so their output mask is all ones
  and the transformer takes no mask (the host refuses connectors without registers).
- Latent (de)normalization uses the VAEs' `latents_mean`/`latents_std` buffers, which live in the
  weights, so it runs inside the decoder programs, never on the host.
"""
from __future__ import annotations

from pathlib import Path

import torch

from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op

PIPELINE_CLASS = "LTX2Pipeline"
# Optional components absent; classes living in diffusers.pipelines.ltx2 are indexed by that
# module name, as the real checkpoint's model_index.json does (diffusers cannot import them flat).
INDEX_EXTRAS = {"processor": [None, None], "prompt_enhancer": [None, None],
                "duration_head": [None, None], "connectors": ["ltx2", "LTX2TextConnectors"],
                "vocoder": ["ltx2", "LTX2Vocoder"]}

# Gemma's special-token layout: pad 0, eos 1, bos 2 (the tiny tokenizer keeps it).
_SPECIAL = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}


def left_padding_mask(valid_text: torch.Tensor, length: int) -> torch.Tensor:
    """[1, length] int64 attention mask of a left-padded prompt with `valid_text` real tokens."""
    positions = torch.arange(length, dtype=torch.int64).unsqueeze(0)
    return (positions >= length - valid_text.reshape(1, 1)).to(torch.int64)


def _input_names(node: Node, *required: str) -> list[str]:
    """The IR input names in order; a DiffletError naming the component when one is missing."""
    names = [n.name for n in node.find(Op.INPUT)]
    missing = [r for r in required if r not in names]
    if missing:
        raise DiffletError(f"{node.attrs['class']} component {node.name!r} needs inputs {missing} "
                           f"(has {names})", where=node.loc)
    return names


class GemmaStackedHidden(torch.nn.Module):
    """(input_ids, valid_text) -> every layer's hidden state stacked on the last dim and flattened,
    as LTX2Pipeline._get_gemma_prompt_embeds: stack(hidden_states, -1).flatten(2, 3)."""

    def __init__(self, model: torch.nn.Module, node: Node) -> None:
        super().__init__()
        self.model = model
        self.names = _input_names(node, "input_ids", "valid_text")

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor]:
        args = dict(zip(self.names, inputs, strict=True))
        ids = args["input_ids"]
        mask = left_padding_mask(args["valid_text"], ids.shape[1])
        out = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        stacked = torch.stack(out.hidden_states, dim=-1)
        return (stacked.flatten(2, 3),)


class ConnectorsProgram(torch.nn.Module):
    """(stacked hidden states, valid_text) -> (video text, audio text) of LTX2TextConnectors, called
    with the left-padding mask and padding_side "left" as LTX2Pipeline calls it."""

    def __init__(self, model: torch.nn.Module, node: Node) -> None:
        super().__init__()
        self.model = model
        self.names = _input_names(node, "text_encoder_hidden_states", "valid_text")

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        args = dict(zip(self.names, inputs, strict=True))
        hidden = args["text_encoder_hidden_states"]
        mask = left_padding_mask(args["valid_text"], hidden.shape[1])
        video, audio, _ = self.model(hidden, mask, padding_side="left")
        return video, audio


TRANSFORMER_INPUTS = ("hidden_states", "audio_hidden_states", "encoder_hidden_states",
                      "audio_encoder_hidden_states", "timestep", "video_coords", "audio_coords")


class TransformerProgram(torch.nn.Module):
    """One LTX2VideoTransformer3DModel call of the pipeline's denoising loop (batch 1): sigma is
    the timestep, RoPE coordinates come in, no text mask (registers), use_cross_timestep=True."""

    def __init__(self, model: torch.nn.Module, node: Node) -> None:
        super().__init__()
        self.model = model
        self.names = _input_names(node, *TRANSFORMER_INPUTS)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        args = dict(zip(self.names, inputs, strict=True))
        video, audio = self.model(
            hidden_states=args["hidden_states"], audio_hidden_states=args["audio_hidden_states"],
            encoder_hidden_states=args["encoder_hidden_states"],
            audio_encoder_hidden_states=args["audio_encoder_hidden_states"],
            timestep=args["timestep"], sigma=args["timestep"],
            video_coords=args["video_coords"], audio_coords=args["audio_coords"],
            isolate_modalities=False, use_cross_timestep=True, return_dict=False)
        return video, audio


class VideoDecodeProgram(torch.nn.Module):
    """Normalized latents [1, C, F, H, W] -> pixels: the pipeline's _denormalize_latents (VAE
    buffers, scaling_factor) then vae.decode(latents, None) (no timestep conditioning)."""

    def __init__(self, model: torch.nn.Module, node: Node) -> None:
        super().__init__()
        self.model = model

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor]:
        mean = self.model.latents_mean.view(1, -1, 1, 1, 1).to(z.device, z.dtype)
        std = self.model.latents_std.view(1, -1, 1, 1, 1).to(z.device, z.dtype)
        z = z * std / self.model.config.scaling_factor + mean
        return (self.model.decode(z, None, return_dict=False)[0],)


class AudioDecodeProgram(torch.nn.Module):
    """Normalized audio latents [1, C, L, M] -> mel: the pipeline denormalizes the packed
    [1, L, C*M] latents with the audio VAE buffers in the latents' dtype (float32 in the
    pipeline, so declare z float32), unpacks, casts to the VAE's dtype, then audio_vae.decode."""

    def __init__(self, model: torch.nn.Module, node: Node) -> None:
        super().__init__()
        self.model = model

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor]:
        mel_bins = z.shape[3]
        packed = z.transpose(1, 2).flatten(2, 3)
        packed = packed * self.model.latents_std.to(z.dtype) + self.model.latents_mean.to(z.dtype)
        z = packed.unflatten(2, (-1, mel_bins)).transpose(1, 2).to(self.model.dtype)
        return (self.model.decode(z, return_dict=False)[0],)


class VocoderProgram(torch.nn.Module):
    """Mel [1, C, T, M] -> waveform [1, channels, samples] (the vocoder returns a bare tensor)."""

    def __init__(self, model: torch.nn.Module, node: Node) -> None:
        super().__init__()
        self.model = model

    def forward(self, mel: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.model(mel),)


PROGRAM_WRAPPERS = {
    "transformers.Gemma3ForConditionalGeneration": GemmaStackedHidden,
    "diffusers.pipelines.ltx2.connectors.LTX2TextConnectors": ConnectorsProgram,
    "diffusers.LTX2VideoTransformer3DModel": TransformerProgram,
    "diffusers.AutoencoderKLLTX2Video": VideoDecodeProgram,
    "diffusers.AutoencoderKLLTX2Audio": AudioDecodeProgram,
    "diffusers.pipelines.ltx2.vocoder.LTX2Vocoder": VocoderProgram,
}


def build_random(comp: Node, config: dict):
    """Random VAEs get random latents_mean/std (the class inits them to 0/1, which would hide a
    missing or wrong denormalization); everything else takes the generic path."""
    if comp.attrs["class"] not in ("diffusers.AutoencoderKLLTX2Video", "diffusers.AutoencoderKLLTX2Audio"):
        return None
    from difflet.codegen.checkpoint import resolve_class

    model = resolve_class(comp.attrs["class"]).from_config(config)
    with torch.no_grad():
        model.latents_mean.normal_(0.0, 0.5)
        model.latents_std.uniform_(0.5, 1.5)
    return model


def write_tokenizer(comp: Node, config: dict, tokenizer_attrs, dest: Path) -> bool:
    """A tiny word-level tokenizer with Gemma's layout (<bos> prepended, no eos, pad 0); the
    pipeline switches padding to the left itself."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    from difflet.codegen.checkpoint import CAPTION_WORDS

    text = config.get("text_config", config)
    vocab = dict(_SPECIAL)
    for word in CAPTION_WORDS:
        vocab.setdefault(word, len(vocab))
    vocab.update({f"tok{i}": i for i in range(len(vocab), int(text["vocab_size"]))})
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=int(tokenizer_attrs["max_length"]),
                                   pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   unk_token="<unk>", padding_side="left")
    fast.save_pretrained(str(dest))
    return True
