"""FLUX.2 [klein] codegen declarations: Flux2KleinPipeline checkpoints, the Qwen3 text-encoder
program, the denoiser program fed host RoPE tables, the VAE decode program, a tiny tokenizer.

Invariants:
- The text-encoder program takes input_ids [1, L] right-padded to the static L and the runtime
  valid_text (the tokenizer's attention-mask count) and returns the hidden states of layers
  TEXT_LAYERS stacked per token, [1, L, len(TEXT_LAYERS) * D]: `_get_qwen3_prompt_embeds` exactly
  (stack on dim 1, permute, reshape). The causal + padding mask is built in the program by
  transformers' own functions (codegen/text_masks.py): the pipeline passes its padding mask and
  the transformer then attends every text row, padding rows included, so they must match too.
- The denoiser attends all L text keys (the pipeline passes no mask): its joint sites are
  `text_mask false`, served by Difflet's joint bounded op with every key valid.
- No RoPE is computed in the denoiser graph (Flux2PosEmbed runs in float64, which Neuron cores
  lack): the host computes img_rope / txt_rope [tokens, 2 * head_dim] (cos | sin, float32) with
  diffusers' own Flux2PosEmbed on the pipeline's ids; the model's pos_embed only splits a table.
- The VAE decode program takes the patchified, batch-normalized latents [1, 4 * z, h, w] the
  denoiser works in and applies the pipeline's tail inside the program (z * sqrt(running_var +
  eps) + running_mean with the VAE's own BatchNorm buffers, unpatchify 2x2, decode), so the
  buffers never leave the checkpoint's weights.
"""
from __future__ import annotations

from pathlib import Path

import torch

from difflet.codegen.decl import ClassDecl, ProbeDecl
from difflet.codegen.probe_feature import FeatureProbe
from difflet.codegen.joint_ops import joint_bounded_attention
from difflet.codegen.program_module import ProgramModule
from difflet.errors import DiffletError
from difflet.families.facts import find_step, guidance_spec
from difflet.families.flux2.facts import DENOISER, FACTS, TEXT_ENCODER, TEXT_LAYERS
from difflet.ir.nodes import Node, Op
from difflet.kernels.select import FUSED

INDEX_EXTRAS: dict = {}  # Flux2KleinPipeline has no optional components
VAE = "diffusers.AutoencoderKLFlux2"


def index_config(module) -> dict:
    """Flux2KleinPipeline's registered config: `is_distilled` (no CFG) when the description's
    guidance mode is "none"."""
    step = find_step(module, "flux2.denoise")
    return {"is_distilled": guidance_spec(step, FACTS.default_guidance)["mode"] == "none"}


def _input_names(node: Node) -> list[str]:
    return [n.name for n in node.find(Op.INPUT)]


class Qwen3StackedLayers(torch.nn.Module):
    """(input_ids [1, L], valid_text) -> layers TEXT_LAYERS' hidden states per token (module docstring)."""

    def __init__(self, model: torch.nn.Module, node: Node) -> None:
        super().__init__()
        if _input_names(node) != ["input_ids", "valid_text"] or len(node.find(Op.OUTPUT)) != 1:
            raise DiffletError(f"text encoder {node.name!r}: FLUX.2's Qwen3 program takes `input_ids` and "
                               f"`valid_text` and gives one output (got {_input_names(node)})", where=node.loc)
        layers = model.config.num_hidden_layers
        if max(TEXT_LAYERS) > layers:
            raise DiffletError(f"text encoder {node.name!r} has {layers} layers; Flux2KleinPipeline reads the "
                               f"hidden states of layers {list(TEXT_LAYERS)}", where=node.loc)
        self.model = model.model  # Qwen3Model: lm_head never runs

    def forward(self, input_ids: torch.Tensor, valid_text: torch.Tensor) -> tuple[torch.Tensor]:
        from difflet.codegen.text_masks import causal_masks

        keep = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :] < valid_text
        out = self.model(input_ids=input_ids, attention_mask=causal_masks(self.model, input_ids, keep),
                         output_hidden_states=True, use_cache=False)
        stacked = torch.stack([out.hidden_states[k] for k in TEXT_LAYERS], dim=1)
        batch, channels, length, width = stacked.shape
        return (stacked.permute(0, 2, 1, 3).reshape(batch, length, channels * width),)


class Flux2BoundedAttnProcessor:
    """Drop-in for Flux2AttnProcessor (dual-stream blocks) and Flux2ParallelSelfAttnProcessor
    (single-stream blocks, fused qkv + mlp) computing q/k/v as they do; only the attention call is
    Difflet's joint bounded op over [text, visual]."""

    kernel = FUSED  # the program's bounded-attention kernel: install_attention sets it (kernels/select.py)

    def __init__(self, text_len: int, text_first: bool = True) -> None:
        if not text_first:
            raise DiffletError("FLUX.2's joint sequence is (text, visual)", where="order")
        self.text_len = text_len

    def _attend(self, query, key, value, image_rotary_emb, text_len) -> torch.Tensor:
        from diffusers.models.embeddings import apply_rotary_emb

        if image_rotary_emb is not None:
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
            key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
        out = joint_bounded_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                      text_len, None, True, self.kernel)
        return out.transpose(1, 2).flatten(2, 3).to(query.dtype)

    def __call__(self, attn, hidden_states: torch.Tensor, *args, valid_text: torch.Tensor | None = None):
        """Flux2Attention calls (encoder_hidden_states, attention_mask, image_rotary_emb) after the
        hidden states, Flux2ParallelSelfAttention (attention_mask, image_rotary_emb); valid_text is
        accepted and unused: every text key is attended."""
        single = hasattr(attn, "to_qkv_mlp_proj")
        encoder_hidden_states, attention_mask, image_rotary_emb = (None, *args) if single else args
        if attention_mask is not None:
            raise DiffletError("FLUX.2 attends every text key: no attention_mask", where="joint_attention_kwargs")
        if single:
            return self._single(attn, hidden_states, image_rotary_emb)
        from diffusers.models.transformers.transformer_flux2 import _get_qkv_projections

        query, key, value, enc_q, enc_k, enc_v = _get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        query = attn.norm_q(query.unflatten(-1, (-1, attn.head_dim)))
        key = attn.norm_k(key.unflatten(-1, (-1, attn.head_dim)))
        value = value.unflatten(-1, (-1, attn.head_dim))
        enc_q = attn.norm_added_q(enc_q.unflatten(-1, (-1, attn.head_dim)))
        enc_k = attn.norm_added_k(enc_k.unflatten(-1, (-1, attn.head_dim)))
        enc_v = enc_v.unflatten(-1, (-1, attn.head_dim))
        text_len = encoder_hidden_states.shape[1]
        out = self._attend(torch.cat([enc_q, query], dim=1), torch.cat([enc_k, key], dim=1),
                           torch.cat([enc_v, value], dim=1), image_rotary_emb, text_len)
        text, visual = out.split_with_sizes([text_len, out.shape[1] - text_len], dim=1)
        return attn.to_out[1](attn.to_out[0](visual)), attn.to_add_out(text)

    def _single(self, attn, hidden_states: torch.Tensor, image_rotary_emb) -> torch.Tensor:
        hidden_states = attn.to_qkv_mlp_proj(hidden_states)
        qkv_dim = 3 * attn.inner_dim
        mlp_dim = attn.mlp_hidden_dim * attn.mlp_mult_factor
        local_qkv = hidden_states.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
        qkv, mlp = torch.split(hidden_states, [local_qkv, hidden_states.shape[-1] - local_qkv], dim=-1)
        query, key, value = (x.unflatten(-1, (-1, attn.head_dim)) for x in qkv.chunk(3, dim=-1))
        query, key = attn.norm_q(query), attn.norm_k(key)
        out = self._attend(query, key, value, image_rotary_emb, self.text_len)
        return attn.to_out(torch.cat([out, attn.mlp_act_fn(mlp)], dim=-1))


class Flux2RopeTable(torch.nn.Module):
    """Stands in for Flux2PosEmbed: the host's [S, 2 * D] table (cos | sin) -> (cos, sin)."""

    def forward(self, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        half = table.shape[-1] // 2
        return table[:, :half], table[:, half:]


# IR input -> the Flux2Transformer2DModel.forward argument it is fed as (forward calls pos_embed
# on img_ids and txt_ids separately, now Flux2RopeTable)
ROPE_INPUTS = {"img_rope": "img_ids", "txt_rope": "txt_ids"}


class Flux2Program(ProgramModule):
    """The denoiser program: IR inputs as ProgramModule, the host's RoPE tables fed in place of
    the position ids and pos_embed replaced by Flux2RopeTable (it holds no tensors)."""

    def __init__(self, model: torch.nn.Module, node: Node) -> None:
        super().__init__(model, node)
        missing = [n for n in ROPE_INPUTS if n not in self.input_names]
        if missing or "guidance" in self.input_names:
            raise DiffletError(f"component {node.name!r}: a FLUX.2 klein denoiser takes img_rope and txt_rope "
                               f"(float32[tokens, 2 * head_dim]) and no guidance; missing {missing}",
                               where=node.loc)
        self.input_names = [ROPE_INPUTS.get(n, n) for n in self.input_names]
        model.pos_embed = Flux2RopeTable()


class Flux2Probe(FeatureProbe):
    """Flux2Transformer2DModel up to the first dual-stream block's modulated visual input (its
    attention's input): x_embedder, the timestep embedding, the global image modulation, norm1.
    It reads no text: the visual modulation depends on the latents and the timestep only."""

    def __init__(self, model: torch.nn.Module, feature_shape: tuple[int, ...], inputs: list[str]) -> None:
        super().__init__(feature_shape, inputs, model.x_embedder.weight.dtype)
        self.x_embedder, self.time_guidance_embed = model.x_embedder, model.time_guidance_embed
        self.modulation, self.norm1 = model.double_stream_modulation_img, model.transformer_blocks[0].norm1

    def feature(self, named: dict[str, torch.Tensor]) -> torch.Tensor:
        from diffusers.models.transformers.transformer_flux2 import Flux2Modulation

        hidden = self.x_embedder(named["hidden_states"])
        # the same scaling and embedding as Flux2Transformer2DModel.forward (no guidance: klein)
        temb = self.time_guidance_embed(named["timestep"].to(hidden.dtype) * 1000, None)
        (shift, scale, _gate), _ = Flux2Modulation.split(self.modulation(temb), 2)
        return (1 + scale) * self.norm1(hidden) + shift


class Flux2Decode(torch.nn.Module):
    """z [1, 4 * C, h, w] (normalized, patchified) -> pixels, the pipeline's tail (module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor]:
        bn = self.model.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(z.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.model.config.batch_norm_eps).to(z.dtype)
        z = z * std + mean
        batch, channels, height, width = z.shape  # Flux2KleinPipeline._unpatchify_latents
        z = z.reshape(batch, channels // 4, 2, 2, height, width).permute(0, 1, 4, 2, 5, 3)
        z = z.reshape(batch, channels // 4, height * 2, width * 2)
        return (self.model.decode(z, return_dict=False)[0],)


def wrap_vae(model: torch.nn.Module, node: Node) -> torch.nn.Module:
    if node.attrs.get("entry") != "decode" or len(_input_names(node)) != 1:
        raise DiffletError(f"component {node.name!r}: FLUX.2's VAE program is `entry decode` with one "
                           "input (the denoiser's latents)", where=node.loc)
    return Flux2Decode(model)


def random_vae(comp: Node, config: dict) -> torch.nn.Module:
    """A random AutoencoderKLFlux2 whose BatchNorm statistics are not the identity (fresh ones are
    mean 0, var 1), so the decode's normalization is exercised."""
    from diffusers import AutoencoderKLFlux2

    model = AutoencoderKLFlux2.from_config(config)
    model.bn.running_mean.copy_(torch.randn_like(model.bn.running_mean) * 0.5)
    model.bn.running_var.copy_(torch.rand_like(model.bn.running_var) + 0.5)
    return model


# Qwen3's chat template, the part a one-message, thinking-off rendering reads (Qwen/Qwen3-*
# tokenizer_config.json `chat_template`: the message loop and the generation prompt)
TINY_CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}")


def write_tokenizer(comp: Node, config: dict, tokenizer_attrs, dest: Path) -> bool:
    """A word-level tokenizer shaped like Qwen3's: chat special tokens and newlines as tokens, no
    added bos/eos, right padding with <|endoftext|>, and Qwen3's chat template."""
    from tokenizers import Regex, pre_tokenizers

    from difflet.codegen.tiny_tokenizers import CAPTION_WORDS, chat_vocab, save_word_level

    vocab_size, pad = int(config["vocab_size"]), int(config.get("pad_token_id") or 0)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<unk>"]
    vocab = chat_vocab(vocab_size, pad, specials, ["\n", "user", "assistant", *CAPTION_WORDS],
                       where=comp.loc if comp is not None else None)
    split = pre_tokenizers.Split(Regex(r"<\|?/?\w+\|?>|\n|\w+|[^\w\s]+"), behavior="removed", invert=True)
    save_word_level(vocab, dest, unk="<unk>", pre_tokenizer=split,
                    model_max_length=int(tokenizer_attrs["max_length"]), pad_token="<|endoftext|>",
                    eos_token="<|im_end|>", additional_special_tokens=specials[1:5],
                    padding_side="right", chat_template=TINY_CHAT_TEMPLATE)
    return True


CLASSES = {
    TEXT_ENCODER: ClassDecl(wrapper=Qwen3StackedLayers, write_tokenizer=write_tokenizer),
    DENOISER: ClassDecl(processor=Flux2BoundedAttnProcessor, wrapper=Flux2Program,
                        probe=ProbeDecl(inputs=("hidden_states", "timestep"), build=Flux2Probe)),
    VAE: ClassDecl(wrapper=wrap_vae, build_random=random_vae),
}
