# img2img (QwenImageImg2ImgPipeline) on the description below, plus the VAE's encoder program and qwen_image.encode_image.
# Qwen-Image in miniature (QwenImagePipeline): the same diffusers/transformers classes at toy size,
# fp32, for CPU tests. Text: Qwen2.5-VL (2 layers, hidden 32; a 1-block vision tower that the
# text-only path never runs), its last decoder layer's hidden states with the 34 chat-template
# tokens dropped. Denoiser: 2 double-stream blocks, 4 heads x 16 (so Ulysses fits 4 ranks), RoPE
# axes 4+6+6; text padding is MASKED inside the program from valid_text (the prompt's real
# length). VAE: two levels (4x spatial), z_dim 4; latents packed 2x2 -> 16 channels, so 64x64
# pixels are an 8 x 8 grid of 64 visual tokens. An image model: one latent frame, decoded whole.

model qwen_image_tiny_img2img family qwen_image

profile {
    images   = 1        # image-to-image: one input image, resized to the output size
    strength = 0.6      # QwenImageImg2ImgPipeline's default
    height   = 64
    width    = 64
    steps    = 4
    guidance = 4.0      # true CFG with the negative prompt (default " "): two denoiser calls
    max_text = 16
    template = 34       # the prompt template tokens the pipeline drops
    dtype    = float32
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "valid text keys; Qwen-Image masks padding, so this is the prompt's real length"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"

encoder text_encoder = transformers.Qwen2_5_VLForConditionalGeneration from "text_encoder" {
    config {
        text_config: {
            vocab_size: 1000, hidden_size: 32, intermediate_size: 37
            num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2
            rope_parameters: { rope_type: "default", mrope_section: [1, 1, 2], rope_theta: 1000000.0 }
            bos_token_id: 1, eos_token_id: 2, pad_token_id: 0
        }
        vision_config: { depth: 1, hidden_size: 16, intermediate_size: 24, num_heads: 2, out_hidden_size: 32 }
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer" max_length max_text + template
    input  input_ids: int64[1, max_text + template]
    output prompt_embeds: dtype[1, max_text + template, 32] select "hidden_states"
}

denoiser transformer = diffusers.QwenImageTransformer2DModel from "transformer" {
    config {
        patch_size: 2, in_channels: 16, out_channels: 4, num_layers: 2
        attention_head_dim: 16, num_attention_heads: 4, joint_attention_dim: 32
        guidance_embeds: false, axes_dims_rope: [4, 6, 6]
    }
    dtype dtype
    input hidden_states:         dtype[1, (height / 8) * (width / 8), 16]
    input encoder_hidden_states: dtype[1, max_text, 32]
    input timestep:              dtype[1]
    input valid_text: runtime valid_text
    output sample: dtype[1, (height / 8) * (width / 8), 16] select 0

    attention "transformer_blocks.*.attn": joint
        heads 4 head_dim 16 order (text, visual) text_mask true valid valid_text
}

# the same VAE's encoder: the input image (one frame) -> mean | logvar, sampled on the host
encoder vae_encoder = diffusers.AutoencoderKLQwenImage from "vae" {
    config {
        base_dim: 8, z_dim: 4, dim_mult: [1, 2, 2], num_res_blocks: 1
        temperal_downsample: [false, true]
        latents_mean: [-0.7571, -0.7089, -0.9113, 0.1075]
        latents_std: [2.8184, 1.4541, 2.3275, 2.6558]
    }
    entry encode
    dtype dtype
    input  x: dtype[1, 3, 1, height, width]
    output moments: dtype[1, 8, 1, height / 4, width / 4] select "latent_dist.parameters"
}

decoder vae = diffusers.AutoencoderKLQwenImage from "vae" {
    config {
        base_dim: 8, z_dim: 4, dim_mult: [1, 2, 2], num_res_blocks: 1
        temperal_downsample: [false, true]
        latents_mean: [-0.7571, -0.7089, -0.9113, 0.1075]
        latents_std: [2.8184, 1.4541, 2.3275, 2.6558]
    }
    entry decode
    dtype dtype
    input  z: dtype[1, 4, 1, height / 4, width / 4]
    output sample: dtype[1, 3, 1, height, width] select "sample"
}

schedule {
    qwen_image.encode_prompt(text_encoder)
    qwen_image.encode_image(vae_encoder)
    qwen_image.prepare_latents()
    qwen_image.denoise(transformer) {
        scheduler: diffusers.FlowMatchEulerDiscreteScheduler {
            shift: 1.0, use_dynamic_shifting: true, base_shift: 0.5, max_shift: 0.9
            base_image_seq_len: 256, max_image_seq_len: 8192, shift_terminal: 0.02
            time_shift_type: "exponential"
        }
        guidance: { mode: "true_cfg", scale: guidance }
    }
    qwen_image.decode(vae)
}
