# FLUX.1 Kontext (instruction editing, FluxKontextPipeline) in miniature: the same diffusers/transformers classes at toy size, fp32, for CPU
# tests. Two VAE blocks -> 2x spatial, latents packed 2x2 -> one token per 4x4 pixels.

model flux_tiny_kontext family flux

profile {
    height   = 32
    width    = 32
    steps    = 4
    guidance = 3.5
    max_text = 32
    clip_len = 16
    dtype    = float32
    images   = 1     # one input image, its tokens appended to the denoiser's visual tokens
    image_width  = width   # the input image is compiled at the output size (each shape bucket's): the
    image_height = height  # pipeline's with _auto_resize=False (its size floored to image_multiple)
    image_multiple = 4   # the pipeline's vae_scale_factor * 2
    image_auto_resize = false
    batch    = 1   # requests per denoiser call (`difflet lower --batch-sizes` adds more)
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "valid T5 text keys; FLUX attends its padding, so the default is the padded length"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"

encoder text_encoder = transformers.CLIPTextModel from "text_encoder" {
    config {
        vocab_size: 1000, hidden_size: 32, intermediate_size: 37
        num_hidden_layers: 2, num_attention_heads: 4, max_position_embeddings: 16
        projection_dim: 32, bos_token_id: 1, eos_token_id: 2, pad_token_id: 0
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer" max_length clip_len
    input  input_ids: int64[1, clip_len]
    output pooled: dtype[1, 32] select "pooler_output"
}

encoder text_encoder_2 = transformers.T5EncoderModel from "text_encoder_2" {
    config {
        vocab_size: 1000, d_model: 32, d_ff: 37, d_kv: 8, num_layers: 2, num_heads: 4
        relative_attention_num_buckets: 8, feed_forward_proj: "gated-gelu"
        pad_token_id: 0, eos_token_id: 2, decoder_start_token_id: 0
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer_2" max_length max_text
    input  input_ids: int64[1, max_text]
    output prompt_embeds: dtype[1, max_text, 32] select "last_hidden_state"
}

denoiser transformer = diffusers.FluxTransformer2DModel from "transformer" {
    config {
        patch_size: 1, in_channels: 16, num_layers: 1, num_single_layers: 2
        attention_head_dim: 16, num_attention_heads: 2, joint_attention_dim: 32
        pooled_projection_dim: 32, guidance_embeds: true, axes_dims_rope: [4, 6, 6]
    }
    dtype dtype
    input hidden_states:         dtype[batch, (height / 4) * (width / 4) + (image_height / 4) * (image_width / 4), 16]
    input encoder_hidden_states: dtype[batch, max_text, 32]
    input pooled_projections:    dtype[batch, 32]
    input timestep:              dtype[batch]
    input img_rope:              float32[(height / 4) * (width / 4) + (image_height / 4) * (image_width / 4),
                                         2 * transformer.attention_head_dim]
    input txt_rope:              float32[max_text, 2 * transformer.attention_head_dim]  # cos | sin: host FluxPosEmbed
    input guidance:              float32[batch]   # the pipeline builds it in fp32
    input valid_text: runtime valid_text
    output sample: dtype[batch, (height / 4) * (width / 4) + (image_height / 4) * (image_width / 4), 16] select 0

    attention "transformer_blocks.*.attn": joint
        heads 2 head_dim 16 order (text, visual) text_mask false valid valid_text
    attention "single_transformer_blocks.*.attn": joint
        heads 2 head_dim 16 order (text, visual) text_mask false valid valid_text
}

encoder vae_encoder = diffusers.AutoencoderKL from "vae" {
    config {
        in_channels: 3, out_channels: 3
        down_block_types: ["DownEncoderBlock2D", "DownEncoderBlock2D"]
        up_block_types: ["UpDecoderBlock2D", "UpDecoderBlock2D"]
        block_out_channels: [8, 16], layers_per_block: 1, latent_channels: 4
        norm_num_groups: 4, sample_size: 32
        scaling_factor: 0.3611, shift_factor: 0.1159
        use_quant_conv: false, use_post_quant_conv: false
    }
    entry encode
    dtype dtype
    input  x: dtype[1, 3, image_height, image_width]
    output moments: dtype[1, 8, image_height / 2, image_width / 2] select "latent_dist.parameters"  # mean | logvar
}

decoder vae = diffusers.AutoencoderKL from "vae" {
    config {
        in_channels: 3, out_channels: 3
        down_block_types: ["DownEncoderBlock2D", "DownEncoderBlock2D"]
        up_block_types: ["UpDecoderBlock2D", "UpDecoderBlock2D"]
        block_out_channels: [8, 16], layers_per_block: 1, latent_channels: 4
        norm_num_groups: 4, sample_size: 32
        scaling_factor: 0.3611, shift_factor: 0.1159
        use_quant_conv: false, use_post_quant_conv: false
    }
    entry decode
    dtype dtype
    input  z: dtype[1, 4, height / 2, width / 2]
    output sample: dtype[1, 3, height, width] select "sample"
}

schedule {
    flux.encode_prompt(text_encoder, text_encoder_2)
    flux.encode_image(vae_encoder) { use: "context" }
    flux.prepare_latents()
    flux.denoise(transformer) {
        scheduler: diffusers.FlowMatchEulerDiscreteScheduler {
            shift: 3.0, use_dynamic_shifting: true
            base_shift: 0.5, max_shift: 1.15
            base_image_seq_len: 256, max_image_seq_len: 4096
        }
        guidance: { mode: "embedded", scale: guidance }
    }
    flux.decode(vae)
}
