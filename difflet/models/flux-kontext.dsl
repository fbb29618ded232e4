# black-forest-labs/FLUX.1-Kontext-dev: instruction editing at real size (FluxKontextPipeline). Every config comes from the
# checkpoint (`difflet lower --weights DIR`), so this serves any checkpoint of these classes (a
# fine-tune of other dimensions too); without weights it lowers with FLUX.1-dev's configs, the
# `default` blocks. Shapes follow the configs: the VAE is 2**(len(block_out_channels) - 1) x
# spatial and latents are packed 2x2, so FLUX.1-dev has one token per 16x16 pixels:
# 1024x1024 -> 4096 visual tokens of 64 channels, joined with 512 T5 tokens (text first).

model flux_kontext family flux

profile {
    height   = 1024
    width    = 1024
    steps    = 28
    guidance = 3.5      # embedded (distilled) guidance, fed to the transformer
    max_text = 512      # T5 max_sequence_length, padded to max_length
    dtype    = bfloat16
    images   = 1        # one input image, its tokens appended to the denoiser's visual tokens
    image_width  = width  # the input image is compiled at the output size: `--shapes` with the preferred
    image_height = height # sizes (README: Image inputs) serves every aspect ratio _auto_resize picks
    image_multiple = 16 # the pipeline's vae_scale_factor * 2
    image_auto_resize = true
    batch    = 1        # requests per denoiser call; `--batch-sizes` compiles more
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "valid T5 text keys; FLUX attends its padding, so the default is the padded length"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"

# openai/clip-vit-large-patch14, text tower
encoder text_encoder = transformers.CLIPTextModel from "text_encoder" {
    config from checkpoint default {
        vocab_size: 49408, hidden_size: 768, intermediate_size: 3072
        num_hidden_layers: 12, num_attention_heads: 12, max_position_embeddings: 77
        projection_dim: 768, hidden_act: "quick_gelu", layer_norm_eps: 0.00001
        bos_token_id: 0, eos_token_id: 2, pad_token_id: 1
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer" max_length text_encoder.max_position_embeddings
    input  input_ids: int64[1, text_encoder.max_position_embeddings]   # CLIP gives only the pooled vector
    output pooled: dtype[1, text_encoder.hidden_size] select "pooler_output"
}

# google/t5-v1_1-xxl, encoder only
encoder text_encoder_2 = transformers.T5EncoderModel from "text_encoder_2" {
    config from checkpoint default {
        vocab_size: 32128, d_model: 4096, d_ff: 10240, d_kv: 64, num_layers: 24, num_heads: 64
        relative_attention_num_buckets: 32, relative_attention_max_distance: 128
        feed_forward_proj: "gated-gelu", layer_norm_epsilon: 0.000001, dropout_rate: 0.1
        tie_word_embeddings: false, pad_token_id: 0, eos_token_id: 1, decoder_start_token_id: 0
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer_2" max_length max_text
    input  input_ids: int64[1, max_text]
    output prompt_embeds: dtype[1, max_text, text_encoder_2.d_model] select "last_hidden_state"
}

# 19 double-stream + 38 single-stream blocks, 24 heads x 128
denoiser transformer = diffusers.FluxTransformer2DModel from "transformer" {
    config from checkpoint default {
        patch_size: 1, in_channels: 64, num_layers: 19, num_single_layers: 38
        attention_head_dim: 128, num_attention_heads: 24, joint_attention_dim: 4096
        pooled_projection_dim: 768, guidance_embeds: true, axes_dims_rope: [16, 56, 56]
    }
    dtype dtype
    # visual tokens: pixels / (VAE scale 2**(len - 1) * pack 2), per side
    input hidden_states: dtype[batch, (height / 2 ** len(vae.block_out_channels))
                                      * (width / 2 ** len(vae.block_out_channels))
                                      + (image_height / 2 ** len(vae.block_out_channels))
                                      * (image_width / 2 ** len(vae.block_out_channels)), transformer.in_channels]
    input encoder_hidden_states: dtype[batch, max_text, transformer.joint_attention_dim]
    input pooled_projections:    dtype[batch, transformer.pooled_projection_dim]
    input timestep:              dtype[batch]
    input img_rope: float32[(height / 2 ** len(vae.block_out_channels))
                            * (width / 2 ** len(vae.block_out_channels))
                            + (image_height / 2 ** len(vae.block_out_channels))
                            * (image_width / 2 ** len(vae.block_out_channels)), 2 * transformer.attention_head_dim]
    input txt_rope: float32[max_text, 2 * transformer.attention_head_dim]  # cos | sin: host FluxPosEmbed
    input guidance:              float32[batch]   # the pipeline builds it in fp32
    input valid_text: runtime valid_text
    output sample: dtype[batch, (height / 2 ** len(vae.block_out_channels))
                                * (width / 2 ** len(vae.block_out_channels))
                                + (image_height / 2 ** len(vae.block_out_channels))
                                * (image_width / 2 ** len(vae.block_out_channels)), transformer.in_channels] select 0

    # one softmax over [text, visual]; no mask in the reference (padding is attended)
    attention "transformer_blocks.*.attn": joint
        heads transformer.num_attention_heads head_dim transformer.attention_head_dim
        order (text, visual) text_mask false valid valid_text
    attention "single_transformer_blocks.*.attn": joint
        heads transformer.num_attention_heads head_dim transformer.attention_head_dim
        order (text, visual) text_mask false valid valid_text
}

# the same VAE's encoder: the input image's mean | logvar, sampled on the host with the request's generator
encoder vae_encoder = diffusers.AutoencoderKL from "vae" {
    config from checkpoint default {
        in_channels: 3, out_channels: 3
        down_block_types: ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"]
        up_block_types: ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"]
        block_out_channels: [128, 256, 512, 512], layers_per_block: 2, latent_channels: 16
        norm_num_groups: 32, act_fn: "silu", sample_size: 1024
        scaling_factor: 0.3611, shift_factor: 0.1159
        use_quant_conv: false, use_post_quant_conv: false
    }
    entry encode
    dtype dtype
    input  x: dtype[1, 3, image_height, image_width]
    output moments: dtype[1, 2 * vae_encoder.latent_channels, image_height / 2 ** (len(vae_encoder.block_out_channels) - 1),
                          image_width / 2 ** (len(vae_encoder.block_out_channels) - 1)] select "latent_dist.parameters"
}

# the SD3 VAE with FLUX's scaling/shift, no quant convs
decoder vae = diffusers.AutoencoderKL from "vae" {
    config from checkpoint default {
        in_channels: 3, out_channels: 3
        down_block_types: ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"]
        up_block_types: ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"]
        block_out_channels: [128, 256, 512, 512], layers_per_block: 2, latent_channels: 16
        norm_num_groups: 32, act_fn: "silu", sample_size: 1024
        scaling_factor: 0.3611, shift_factor: 0.1159
        use_quant_conv: false, use_post_quant_conv: false
    }
    entry decode
    dtype dtype
    input  z: dtype[1, vae.latent_channels, height / 2 ** (len(vae.block_out_channels) - 1),
                    width / 2 ** (len(vae.block_out_channels) - 1)]
    output sample: dtype[1, 3, height, width] select "sample"
}

schedule {
    flux.encode_prompt(text_encoder, text_encoder_2)
    flux.encode_image(vae_encoder) { use: "context" }
    flux.prepare_latents()
    flux.denoise(transformer) {
        # sigmas = linspace(1, 1/steps); mu from the token count (1.15 at 4096 tokens)
        scheduler: diffusers.FlowMatchEulerDiscreteScheduler {
            shift: 3.0, use_dynamic_shifting: true
            base_shift: 0.5, max_shift: 1.15
            base_image_seq_len: 256, max_image_seq_len: 4096
        }
        guidance: { mode: "embedded", scale: guidance }
    }
    flux.decode(vae)
}
