# hunyuanvideo-community/HunyuanVideo at real size (HunyuanVideoPipeline), 320x512, 61 frames. Every
# config comes from the checkpoint (`difflet lower --weights DIR`), so this serves any HunyuanVideo
# checkpoint of these classes (a fine-tune of other dimensions); without weights it lowers with the
# real configs, the `default` blocks. Shapes follow the configs as HunyuanVideoPipeline computes
# them: latents [1, transformer.in_channels, (frames - 1) / vae.temporal_compression_ratio + 1,
# height / vae.spatial_compression_ratio, width / vae.spatial_compression_ratio]; the real VAE:
# 8x spatial, 4x temporal -> [1, 16, 16, 40, 64]; patch 2 (patch_t 1) -> 16 x 20 x 32 = 10,240
# visual tokens, joined with 256 Llama tokens (visual first). Text dims: the Llama's hidden_size
# (the transformer's text_embed_dim, 4096) and the CLIP's (pooled_projection_dim, 768). The
# reference masks text padding (the refiner and the main blocks), so valid_text is the prompt's
# real length.

model hunyuan_video family hunyuan_video

profile {
    height   = 320
    width    = 512
    frames   = 61
    steps    = 50
    guidance = 6.0      # embedded guidance (x1000 in the pipeline), one pass
    max_text = 256
    template = 95       # the prompt template tokens the pipeline crops
    clip_len = 77
    dtype    = bfloat16
    batch    = 1        # requests per denoiser call (`difflet lower --batch-sizes` adds more)
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "valid Llama text keys; HunyuanVideo masks its padding"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"

# llava-llama-3-8b text tower; the pipeline takes hidden_states[-3]
encoder text_encoder = transformers.LlamaModel from "text_encoder" {
    config from checkpoint default {
        vocab_size: 128320, hidden_size: 4096, intermediate_size: 14336, num_hidden_layers: 32
        num_attention_heads: 32, num_key_value_heads: 8, max_position_embeddings: 8192
        rms_norm_eps: 0.00001, hidden_act: "silu"
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer" max_length max_text + template
    input  input_ids: int64[1, max_text + template]
    output prompt_embeds: dtype[1, max_text + template, text_encoder.hidden_size] select "hidden_states"
}

encoder text_encoder_2 = transformers.CLIPTextModel from "text_encoder_2" {
    config from checkpoint default {
        vocab_size: 49408, hidden_size: 768, intermediate_size: 3072
        num_hidden_layers: 12, num_attention_heads: 12, max_position_embeddings: 77
        projection_dim: 768, hidden_act: "quick_gelu", layer_norm_eps: 0.00001
        bos_token_id: 0, eos_token_id: 2, pad_token_id: 1
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer_2" max_length clip_len
    input  input_ids: int64[1, clip_len]
    output pooled: dtype[1, text_encoder_2.hidden_size] select "pooler_output"
}

# the real model: 2 refiner + 20 dual-stream + 40 single-stream blocks, 24 heads x 128
denoiser transformer = diffusers.HunyuanVideoTransformer3DModel from "transformer" {
    config from checkpoint default {
        in_channels: 16, out_channels: 16, num_attention_heads: 24, attention_head_dim: 128
        num_layers: 20, num_single_layers: 40, num_refiner_layers: 2, mlp_ratio: 4.0
        patch_size: 2, patch_size_t: 1, qk_norm: "rms_norm", guidance_embeds: true
        text_embed_dim: 4096, pooled_projection_dim: 768, rope_theta: 256.0
        rope_axes_dim: [16, 56, 56]
    }
    dtype dtype
    input hidden_states:          dtype[batch, transformer.in_channels, (frames - 1) / vae.temporal_compression_ratio + 1,
                                        height / vae.spatial_compression_ratio, width / vae.spatial_compression_ratio]
    input timestep:               float32[batch]   # the pipeline passes the fp32 timestep
    input encoder_hidden_states:  dtype[batch, max_text, transformer.text_embed_dim]
    # no mask input: the program builds encoder_attention_mask from valid_text
    input pooled_projections:     dtype[batch, transformer.pooled_projection_dim]
    input guidance:               float32[batch]
    input valid_text: runtime valid_text
    output sample: dtype[batch, transformer.out_channels, (frames - 1) / vae.temporal_compression_ratio + 1,
                         height / vae.spatial_compression_ratio, width / vae.spatial_compression_ratio] select 0

    # the token refiner's self-attention (its heads over the text) keeps diffusers' masked SDPA:
    # codegen installs Difflet's bounded attention at joint sites only
    attention "transformer_blocks.*.attn": joint
        heads transformer.num_attention_heads head_dim transformer.attention_head_dim
        order (visual, text) text_mask true valid valid_text
    attention "single_transformer_blocks.*.attn": joint
        heads transformer.num_attention_heads head_dim transformer.attention_head_dim
        order (visual, text) text_mask true valid valid_text
}

# Whole-clip decode, compiled at the profile's frame count: AutoencoderKLHunyuanVideo.decode as
# diffusers runs it (its framewise temporal tiling, when latent frames > 4, is traced into the
# program). Not a fixed-size temporal chunk program: the decoder's GroupNorms take statistics over
# every frame of a tile (no causal cache to carry) and the default tiling's tail tiles are shorter
# (61 frames: tiles of 5, 5, 5, 5, 4, 1 latent frames), so each tile length would need a program.
decoder vae = diffusers.AutoencoderKLHunyuanVideo from "vae" {
    config from checkpoint default {
        in_channels: 3, out_channels: 3, latent_channels: 16, block_out_channels: [128, 256, 512, 512]
        layers_per_block: 2, norm_num_groups: 32, act_fn: "silu", scaling_factor: 0.476986
        spatial_compression_ratio: 8, temporal_compression_ratio: 4, mid_block_add_attention: true
    }
    entry decode
    dtype dtype
    input  z: dtype[1, vae.latent_channels, (frames - 1) / vae.temporal_compression_ratio + 1,
                    height / vae.spatial_compression_ratio, width / vae.spatial_compression_ratio]
    output sample: dtype[1, vae.out_channels, frames, height, width] select "sample"
}

schedule {
    hunyuan_video.encode_prompt(text_encoder, text_encoder_2)
    hunyuan_video.prepare_latents()
    hunyuan_video.denoise(transformer) {
        scheduler: diffusers.FlowMatchEulerDiscreteScheduler { shift: 7.0, use_dynamic_shifting: false }
        guidance: { mode: "embedded", scale: guidance }
    }
    hunyuan_video.decode(vae)
}
