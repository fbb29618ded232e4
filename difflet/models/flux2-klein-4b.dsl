# black-forest-labs/FLUX.2-klein-4B at real size (Flux2KleinPipeline, is_distilled true): step-distilled,
# 1024x1024, its model card's call: 4 steps, guidance 1.0 (the pipeline runs no CFG: one pass a step).
# Configs come from the checkpoint (`difflet lower --weights DIR`); the `default` blocks are
# klein 4B's (transformer/config.json: 5 dual-stream + 20 single-stream blocks, 24 heads x 128,
# joint_attention_dim 7680 = 3 stacked Qwen3-4B layers x 2560), used when lowering without weights.
# Shapes follow the configs as the pipeline computes them: vae_scale_factor =
# 2 ** (len(vae.block_out_channels) - 1) (8), latents of vae.latent_channels (32) patchified 2x2 ->
# transformer.in_channels (128) per token, so 1024x1024 is (1024 / 16) ** 2 = 4096 visual tokens.
# Text: Qwen3-4B's hidden states of layers 9, 18 and 27 stacked per token, 512 tokens (the
# pipeline's max_sequence_length), padding included (the transformer attends every row).

model flux2_klein_4b family flux2

profile {
    height   = 1024
    width    = 1024
    steps    = 4
    guidance = 1.0      # ignored by a distilled checkpoint: one denoiser pass
    max_text = 512
    dtype    = bfloat16
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "the chat-templated prompt's token count: the encoder masks the padding after it (the denoiser attends it)"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"

# Qwen3-4B (36 layers, 32 heads / 8 KV heads x 128)
encoder text_encoder = transformers.Qwen3ForCausalLM from "text_encoder" {
    config from checkpoint default {
        vocab_size: 151936, hidden_size: 2560, intermediate_size: 9728, num_hidden_layers: 36
        num_attention_heads: 32, num_key_value_heads: 8, head_dim: 128, max_position_embeddings: 40960
        rms_norm_eps: 0.000001, rope_theta: 1000000.0, tie_word_embeddings: true
        bos_token_id: 151643, eos_token_id: 151645
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer" max_length max_text
    input  input_ids: int64[1, max_text]
    input  valid_text: runtime valid_text
    output prompt_embeds: dtype[1, max_text, 3 * text_encoder.hidden_size] select 0
}

denoiser transformer = diffusers.Flux2Transformer2DModel from "transformer" {
    config from checkpoint default {
        patch_size: 1, in_channels: 128, num_layers: 5, num_single_layers: 20
        attention_head_dim: 128, num_attention_heads: 24, joint_attention_dim: 7680
        timestep_guidance_channels: 256, mlp_ratio: 3.0, axes_dims_rope: [32, 32, 32, 32]
        rope_theta: 2000, eps: 0.000001, guidance_embeds: false
    }
    dtype dtype
    input hidden_states: dtype[1, (height / 2 ** len(vae.block_out_channels)) * (width / 2 ** len(vae.block_out_channels)),
                               transformer.in_channels]
    input encoder_hidden_states: dtype[1, max_text, 3 * text_encoder.hidden_size]
    input timestep:              dtype[1]
    input img_rope: float32[(height / 2 ** len(vae.block_out_channels)) * (width / 2 ** len(vae.block_out_channels)),
                            2 * transformer.attention_head_dim]
    input txt_rope: float32[max_text, 2 * transformer.attention_head_dim]  # cos | sin: host Flux2PosEmbed
    input valid_text: runtime valid_text   # always its default: the denoiser attends every text row
    output sample: dtype[1, (height / 2 ** len(vae.block_out_channels)) * (width / 2 ** len(vae.block_out_channels)),
                         transformer.in_channels] select 0

    attention "transformer_blocks.*.attn": joint
        heads transformer.num_attention_heads head_dim transformer.attention_head_dim
        order (text, visual) text_mask false valid valid_text
    attention "single_transformer_blocks.*.attn": joint
        heads transformer.num_attention_heads head_dim transformer.attention_head_dim
        order (text, visual) text_mask false valid valid_text
}

decoder vae = diffusers.AutoencoderKLFlux2 from "vae" {
    config from checkpoint default {
        in_channels: 3, out_channels: 3
        down_block_types: ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"]
        up_block_types: ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"]
        block_out_channels: [128, 256, 512, 512], layers_per_block: 2, latent_channels: 32
        norm_num_groups: 32, act_fn: "silu", sample_size: 1024, use_quant_conv: true
        use_post_quant_conv: true, batch_norm_eps: 0.0001, patch_size: [2, 2]
    }
    entry decode
    dtype dtype
    # patchified, batch-normalized: the denoiser's latents as a grid (the program undoes both)
    input  z: dtype[1, 4 * vae.latent_channels, height / 2 ** len(vae.block_out_channels),
                    width / 2 ** len(vae.block_out_channels)]
    output sample: dtype[1, 3, height, width] select 0
}

schedule {
    flux2.encode_prompt(text_encoder)
    flux2.prepare_latents()
    flux2.denoise(transformer) {
        # sigmas = linspace(1, 1/steps); mu = the pipeline's empirical mu (token count and steps),
        # so of this config only use_dynamic_shifting and the exponential time shift act
        scheduler: diffusers.FlowMatchEulerDiscreteScheduler {
            shift: 3.0, use_dynamic_shifting: true
            base_shift: 0.5, max_shift: 1.15, base_image_seq_len: 256, max_image_seq_len: 4096
        }
        guidance: { mode: "none", scale: guidance }
    }
    flux2.decode(vae)
}
