"""Wan 2.1 codegen declarations: WanPipeline / WanImageToVideoPipeline checkpoints, the masked
UMT5 program, the chunked VAE decoder, the CLIP image encoder.

Invariants:
- The UMT5 program takes padded input_ids and the runtime value `valid_text` (the prompt's token
  count), builds the attention mask from it, and returns last_hidden_state with rows >= valid_text
  zeroed: exactly WanPipeline's `_get_t5_prompt_embeds` (mask, encode, cut, zero-pad) for one prompt.
- The VAE decodes one latent frame per call, causal caches in and out (wan/vae.py),
  when its IR declares them (outputs sample, next_cache0, ...). The transformer needs no hook: it
  attends the zero-padded text unmasked, so its stock attention compiles as is.
- The CLIP image encoder program returns hidden states the pipeline reads (hidden_states[-2]);
  its CLIPImageProcessor stays on the host (`host_folders`), as a tokenizer does.
- A wrapper whose IR does not have its inputs (e.g. another family's UMT5) falls back to the
  generic ProgramModule.
- Split WanTransformer3DModel: its IR input is the video latent, which the model patches itself,
  so the visual stream is sharded inside the model where diffusers' own `_cp_plan` shards it
  (blocks.0's input, the rope tables, proj_out's output), and the split attention is
  wan/attention.py's. Text is replicated (with SP: a token shard of the text embedder).
"""
from __future__ import annotations

import torch

from difflet.codegen.decl import BlockDecl, ClassDecl, ProbeDecl, SplitDecl
from difflet.codegen.text_masks import bidirectional_mask
from difflet.codegen.probe_feature import FeatureProbe
from difflet.ir.nodes import Node, Op

# WanPipeline's optional Wan 2.2 low-noise transformer; absent in Wan 2.1
INDEX_EXTRAS = {"transformer_2": [None, None]}


def index_config(module) -> dict:
    """WanPipeline's registered config a materialized checkpoint states, as Wan 2.2's do:
    `boundary_ratio` (A14B) and `expand_timesteps` (TI2V-5B), from the wan.denoise step; a
    schedule that encodes an image is WanImageToVideoPipeline's (Wan 2.2 I2V has no CLIP encoder
    to name it, write_image_processor)."""
    from difflet.families.facts import find_step

    step = find_step(module, "wan.denoise")
    attrs = {} if step is None else step.attrs
    image = {"_class_name": "WanImageToVideoPipeline"} if find_step(module, "wan.encode_image") else {}
    return {**image,
            **({"boundary_ratio": float(attrs["boundary_ratio"])} if attrs.get("boundary_ratio") is not None else {}),
            **({"expand_timesteps": True} if attrs.get("expand_timesteps") else {})}


IMAGE_PROCESSOR = "image_processor"  # WanImageToVideoPipeline's CLIPImageProcessor folder


def _input_names(node: Node) -> list[str]:
    return [n.name for n in node.find(Op.INPUT)]


class MaskedUMT5Encoder(torch.nn.Module):
    """(input_ids [1, T], valid_text 0-d int64) -> (last_hidden_state [1, T, D], zero from valid_text on)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, valid_text: torch.Tensor) -> tuple[torch.Tensor]:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        keep = positions[None, :] < valid_text  # the tokenizer's attention mask: right padding
        # the 4-D mask built here: no host read of the padding (family/text_masks.py)
        hidden = self.model(input_ids=input_ids, attention_mask=bidirectional_mask(self.model, input_ids, keep)
                            ).last_hidden_state
        # WanPipeline keeps u[:len] and appends zeros: select, so the kept rows are untouched
        return (torch.where(keep[..., None], hidden, torch.zeros_like(hidden)),)


def wrap_umt5(model: torch.nn.Module, node: Node) -> torch.nn.Module:
    from difflet.codegen.program_module import ProgramModule

    if _input_names(node) != ["input_ids", "valid_text"]:
        return ProgramModule(model, node)
    return MaskedUMT5Encoder(model)


def wrap_vae(model: torch.nn.Module, node: Node) -> torch.nn.Module:
    from difflet.codegen.program_module import ProgramModule
    from difflet.families.wan.vae import WanChunkDecoder

    if [o.name for o in node.find(Op.OUTPUT)][1:2] != ["next_cache0"]:
        return ProgramModule(model, node)  # a whole-clip `decode`
    return WanChunkDecoder(model, node)


class WanProbe(FeatureProbe):
    """WanTransformer3DModel up to the first block's modulated self-attention input: patch
    embedding, the condition embedder's timestep path (its text path feeds only cross-attention,
    so the probe reads no text) and blocks[0]'s norm1 with scale_shift_table's shift and scale."""

    def __init__(self, model: torch.nn.Module, feature_shape: tuple[int, ...], inputs: list[str]) -> None:
        super().__init__(feature_shape, inputs, model.patch_embedding.weight.dtype)
        cond = model.condition_embedder
        self.patch_embedding, self.timesteps_proj = model.patch_embedding, cond.timesteps_proj
        self.time_embedder, self.act_fn, self.time_proj = cond.time_embedder, cond.act_fn, cond.time_proj
        self.block = model.blocks[0]

    def feature(self, named: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = self.patch_embedding(named["hidden_states"]).flatten(2).transpose(1, 2)
        timestep = named["timestep"]
        per_token = timestep.ndim == 2  # t per token (Wan 2.2 TI2V's expand_timesteps): [1, S]
        # WanTimeTextImageEmbedding's timestep path, as its forward casts it
        proj = self.timesteps_proj(timestep.flatten())
        proj = proj.unflatten(0, (-1, timestep.shape[1])) if per_token else proj
        temb = self.time_embedder(proj.to(next(iter(self.time_embedder.parameters())).dtype)).type_as(hidden)
        timestep_proj = self.time_proj(self.act_fn(temb)).unflatten(temb.ndim - 1, (6, -1))
        table = self.block.scale_shift_table.unsqueeze(0) if per_token else self.block.scale_shift_table
        shift, scale = (table + timestep_proj.float()).chunk(6, dim=temb.ndim - 1)[:2]
        if per_token:  # [1, S, 1, D] -> [1, S, D], as WanTransformerBlock squeezes them
            shift, scale = shift.squeeze(2), scale.squeeze(2)
        return (self.block.norm1(hidden.float()) * (1 + scale) + shift).type_as(hidden)


def wrap_clip_vision(model: torch.nn.Module, node: Node) -> torch.nn.Module:
    """CLIPVisionModel as WanImageToVideoPipeline.encode_image calls it: every layer's hidden
    states returned (output_hidden_states=True), the outputs' selects reading them
    ("hidden_states.-2": the penultimate layer's)."""
    from difflet.codegen.program_module import ProgramModule, _select

    class HiddenStates(ProgramModule):
        def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            result = self.model(**dict(zip(self.input_names, inputs, strict=True)), output_hidden_states=True)
            return tuple(_select(result, sel) for sel in self.selects)

    return HiddenStates(model, node)


def write_image_processor(comp: Node, config: dict, dest) -> dict:
    """The tiny checkpoint's image_processor/: CLIPImageProcessor's defaults (the hub I2V
    checkpoints' own: OpenAI CLIP mean/std, bicubic) at the encoder's image_size, and the
    model_index.json entries naming it and WanImageToVideoPipeline (a CLIP vision encoder is
    only an image-to-video checkpoint's)."""
    from transformers import CLIPImageProcessor

    size = int(config.get("image_size", 224))
    CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size}
                       ).save_pretrained(str(dest / IMAGE_PROCESSOR))
    return {IMAGE_PROCESSOR: ["transformers", "CLIPImageProcessor"], "_class_name": "WanImageToVideoPipeline"}


def _wan_split_processor(*args):
    # imported when a split is built: it pulls in torch.distributed, which unsplit programs never need
    from difflet.families.wan.attention import WanSplitAttnProcessor

    return WanSplitAttnProcessor(*args)


CLASSES = {
    "diffusers.WanTransformer3DModel": ClassDecl(
        split=SplitDecl(visual_inputs={}, visual_outputs={},  # a 5-d latent: sharded in the model
                        sp_entries=("condition_embedder.text_embedder",),
                        joint_prefixes=(),  # no joint sequence: self-attention and text cross-attention
                        processor=_wan_split_processor,
                        stream_entries={"blocks.0": 1}, stream_exits={"proj_out": 1},
                        cp_tables={"rope": 1}, stream_inputs={"timestep": 1}),  # TI2V's t per token
        probe=ProbeDecl(inputs=("hidden_states", "timestep"), build=WanProbe),
        blocks=BlockDecl(stacks=("blocks",), outputs=("hidden_states",), tail=("hidden_states",))),
    "transformers.UMT5EncoderModel": ClassDecl(wrapper=wrap_umt5),
    # image-to-video's image encoder; its host step reads the pipeline's CLIPImageProcessor
    "transformers.CLIPVisionModel": ClassDecl(wrapper=wrap_clip_vision, write_extras=write_image_processor,
                                              host_folders=(IMAGE_PROCESSOR,)),
    "diffusers.AutoencoderKLWan": ClassDecl(wrapper=wrap_vae, branch_inputs=("first",)),
}
