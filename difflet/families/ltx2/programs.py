"""LTX-2 codegen declarations: LTX2Pipeline checkpoints, its components' program wrappers, RoPE.

Invariants:
- Every wrapper takes the component's IR inputs positionally (IR order) and returns its IR outputs,
  computing exactly what LTX2Pipeline does around that module call (operation for operation).
- The prompt's padding never crosses as a mask: the Gemma tokenizer pads LEFT (the pipeline forces
  it), so the valid tokens are the last `valid_text` positions; the encoder and the connectors build
  that mask inside the program from the runtime value `valid_text` (a 0-d int64 program input,
  range-checked by the runtime before every call).
- The connectors replace the padding with learnable registers, so their output mask is all ones
  and the transformer takes no mask (the host refuses connectors without registers).
- RoPE (`LTX2AudioVideoRotaryPosEmbed`, `LTX2RotaryPosEmbed1d`) without float64 ops: the only
  float64 value is the frequency grid `theta ** linspace(0, 1, n)`, a constant. It is computed on
  the host in float64 and kept as float32 buffers (one per grid length the module can ask for);
  the module runs with diffusers' `double_precision=False` and a TorchFunctionMode scoped to its
  forward hands it the host values (`_HostPow`), so its tables are bit-identical to diffusers'
  float64 path (a float32 `pow` would be ~4 ulp off, enough to flip uint8 pixels of the video).
- Latent (de)normalization uses the VAEs' `latents_mean`/`latents_std` buffers, which live in the
  weights, so it runs inside the VAE programs (decoders, the image-to-video encoder), never on
  the host.
- Split LTX2VideoTransformer3DModel (TransformerProgram's calling convention on every rank): CP
  shards the video stream only; audio and both texts stay replicated over cp (why, from the real
  sizes, and the attention each site runs: ltx2/attention.py). Every block linear of both
  streams is TP-split by heads; with SP every stream is token-sharded over tp.
"""
from __future__ import annotations

from pathlib import Path


import torch

from difflet.codegen.decl import BlockDecl, ClassDecl, ProbeDecl, SplitDecl
from difflet.codegen.probe_feature import FeatureProbe
from difflet.codegen.text_masks import causal_masks
from difflet.errors import DiffletError
from difflet.families.ltx2 import guidance
from difflet.families.ltx2.rope import FP32_ROPE  # noqa: F401 -- codegen/rope.py reads it here
from difflet.ir.nodes import Node, Op

# Optional components absent; classes living in diffusers.pipelines.ltx2 are indexed by that
# module name, as the real checkpoint's model_index.json does (diffusers cannot import them flat).
INDEX_EXTRAS = {"processor": [None, None], "prompt_enhancer": [None, None],
                "duration_head": [None, None], "connectors": ["ltx2", "LTX2TextConnectors"],
                "vocoder": ["ltx2", "LTX2Vocoder"]}

# Gemma's special-token layout: pad 0, eos 1, bos 2 (the tiny tokenizer keeps it).
_SPECIAL = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}


def left_padding_mask(valid_text: torch.Tensor, length: int) -> torch.Tensor:
    """[1, length] int64 attention mask of a left-padded prompt with `valid_text` real tokens."""
    # on valid_text's device: a program moved to an accelerator (XLA, Neuron) holds no CPU tensors
    positions = torch.arange(length, dtype=torch.int64, device=valid_text.device).unsqueeze(0)
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

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Gemma3Model's token embedding, its out-of-vocabulary image token read as 0 with a
        select (Gemma3Model's boolean-mask assignment is a nonzero: a data-dependent shape)."""
        image_token = self.model.config.image_token_id
        if image_token >= self.model.config.get_text_config().vocab_size:
            ids = torch.where(ids == image_token, torch.zeros_like(ids), ids)
        return self.model.get_input_embeddings()(ids)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor]:
        args = dict(zip(self.names, inputs, strict=True))
        ids = args["input_ids"]
        mask = causal_masks(self.model, ids, left_padding_mask(args["valid_text"], ids.shape[1]))  # text_masks.py
        out = self.model(inputs_embeds=self._embed(ids), attention_mask=mask, output_hidden_states=True,
                         use_cache=False)
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
    the timestep, RoPE coordinates come in, no text mask (registers), use_cross_timestep=True.
    An image-to-video transformer also takes `video_timestep` [1, video tokens] (the step's
    timestep times 1 - conditioning mask): the video stream's timestep, while `timestep` stays
    the audio timestep and sigma, as LTX2ImageToVideoPipeline calls it. A runtime input
    `guidance_pass` selects LTX2Pipeline's STG or modality-isolated pass (ltx2/guidance.py)."""

    def __init__(self, model: torch.nn.Module, node: Node) -> None:
        super().__init__()
        self.model = model
        self.names = _input_names(node, *TRANSFORMER_INPUTS)
        # a list: the switch is no submodule and holds no tensor between calls
        self.switch = [guidance.install(model, node)] if guidance.INPUT in self.names else []

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        args = dict(zip(self.names, inputs, strict=True))
        for switch in self.switch:
            switch.value = args[guidance.INPUT]
        try:
            return self._call(args)
        finally:
            for switch in self.switch:
                switch.value = None

    def _call(self, args: dict) -> tuple[torch.Tensor, torch.Tensor]:
        video, audio = self.model(
            hidden_states=args["hidden_states"], audio_hidden_states=args["audio_hidden_states"],
            encoder_hidden_states=args["encoder_hidden_states"],
            audio_encoder_hidden_states=args["audio_encoder_hidden_states"],
            timestep=args.get("video_timestep", args["timestep"]), audio_timestep=args["timestep"],
            sigma=args["timestep"],
            video_coords=args["video_coords"], audio_coords=args["audio_coords"],
            isolate_modalities=False, use_cross_timestep=True, return_dict=False)
        return video, audio


class LTX2Probe(FeatureProbe):
    """LTX2VideoTransformer3DModel up to the first block's modulated video self-attention input:
    proj_in, time_embed (the timestep is the sigma TransformerProgram passes) and norm1 with
    scale_shift_table's shift and scale. Video stream only: the audio stream and the text feed
    neither (its change tracks the video tokens, the bulk of the sequence)."""

    def __init__(self, model: torch.nn.Module, feature_shape: tuple[int, ...], inputs: list[str]) -> None:
        super().__init__(feature_shape, inputs, model.proj_in.weight.dtype)
        self.proj_in, self.time_embed = model.proj_in, model.time_embed
        self.block = model.transformer_blocks[0]

    def feature(self, named: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = self.proj_in(named["hidden_states"])
        batch = hidden.shape[0]
        temb = self.time_embed(named["timestep"].flatten(), batch_size=batch, hidden_dtype=hidden.dtype)[0]
        temb = temb.view(batch, -1, temb.size(-1))
        shift, scale = self.block.get_mod_params(self.block.scale_shift_table, temb, batch)[:2]
        return self.block.norm1(hidden) * (1 + scale) + shift


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


class VideoEncodeProgram(torch.nn.Module):
    """Pixels [1, 3, 1, H, W] -> the first frame's normalized latents [1, C, 1, h, w] in float32:
    LTX2ImageToVideoPipeline.prepare_latents' retrieve_latents(vae.encode(image), "argmax") (the
    mean: no random draw), cast to float32, then _normalize_latents with the VAE buffers and its
    default scaling factor 1 (the pipeline passes none here, unlike when it denormalizes)."""

    def __init__(self, model: torch.nn.Module, node: Node) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        z = self.model.encode(x).latent_dist.mode().to(torch.float32)
        mean = self.model.latents_mean.view(1, -1, 1, 1, 1).to(z.device, z.dtype)
        std = self.model.latents_std.view(1, -1, 1, 1, 1).to(z.device, z.dtype)
        return ((z - mean) * 1.0 / std,)


def wrap_video_vae(model: torch.nn.Module, node: Node) -> torch.nn.Module:
    """The VAE's program by its entry: `encode` (an image-to-video profile's first frame) or decode."""
    return (VideoEncodeProgram if node.attrs.get("entry") == "encode" else VideoDecodeProgram)(model, node)


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


def build_random(comp: Node, config: dict):
    """A random VAE with random latents_mean/std (the class inits them to 0/1, which would hide a
    missing or wrong denormalization)."""
    from difflet.frontend.classes import resolve_class

    model = resolve_class(comp.attrs["class"]).from_config(config)
    with torch.no_grad():
        model.latents_mean.normal_(0.0, 0.5)
        model.latents_std.uniform_(0.5, 1.5)
    return model


def write_tokenizer(comp: Node, config: dict, tokenizer_attrs, dest: Path) -> bool:
    """A tiny word-level tokenizer with Gemma's layout (<bos> prepended, no eos, pad 0); the
    pipeline switches padding to the left itself."""
    from tokenizers import processors

    from difflet.codegen.tiny_tokenizers import CAPTION_WORDS, save_word_level

    text = config.get("text_config", config)
    vocab = dict(_SPECIAL)
    for word in CAPTION_WORDS:
        vocab.setdefault(word, len(vocab))
    vocab.update({f"tok{i}": i for i in range(len(vocab), int(text["vocab_size"]))})
    post = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    save_word_level(vocab, dest, unk="<unk>", post_processor=post,
                    model_max_length=int(tokenizer_attrs["max_length"]), pad_token="<pad>",
                    eos_token="<eos>", bos_token="<bos>", padding_side="left")
    return True


def _ltx2_split_processor(*args):
    # imported when a split is built: it pulls in torch.distributed, which unsplit programs never need
    from difflet.families.ltx2.attention import LTX2SplitAttnProcessor

    return LTX2SplitAttnProcessor(*args)


TRANSFORMER_SPLIT = SplitDecl(
    # video_timestep: image-to-video's per-token timestep (absent from a text-to-video program)
    visual_inputs={"hidden_states": 1, "video_coords": 2, "video_timestep": 1}, visual_outputs={"sample": 1},
    sp_entries=("proj_in", "audio_proj_in", "caption_projection", "audio_caption_projection"),
    joint_prefixes=(),  # no joint sequence: every site is self- or cross-attention
    processor=_ltx2_split_processor, sp_outputs={"audio_sample": 1},
    head_tables={"rope": 1, "audio_rope": 1, "cross_attn_rope": 1, "cross_attn_audio_rope": 1})

CLASSES = {
    "transformers.Gemma3ForConditionalGeneration": ClassDecl(wrapper=GemmaStackedHidden,
                                                             write_tokenizer=write_tokenizer),
    "diffusers.pipelines.ltx2.connectors.LTX2TextConnectors": ClassDecl(wrapper=ConnectorsProgram),
    "diffusers.LTX2VideoTransformer3DModel": ClassDecl(
        wrapper=TransformerProgram, split=TRANSFORMER_SPLIT,
        probe=ProbeDecl(inputs=("hidden_states", "timestep"), build=LTX2Probe),
        blocks=BlockDecl(stacks=("transformer_blocks",), outputs=("hidden_states", "audio_hidden_states"),
                         tail=("hidden_states", "audio_hidden_states"))),
    "diffusers.AutoencoderKLLTX2Video": ClassDecl(wrapper=wrap_video_vae, build_random=build_random),
    "diffusers.AutoencoderKLLTX2Audio": ClassDecl(wrapper=AudioDecodeProgram, build_random=build_random),
    "diffusers.pipelines.ltx2.vocoder.LTX2Vocoder": ClassDecl(wrapper=VocoderProgram),
}
