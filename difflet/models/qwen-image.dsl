# Qwen/Qwen-Image at real size (QwenImagePipeline), 1024x1024.
# VAE 8x spatial, latents packed 2x2 -> 4096 visual tokens of 64 channels; text is the
# Qwen2.5-VL last decoder layer's hidden states (template cropped), at most 512 tokens, padding masked.

model qwen_image family qwen_image

profile {
    height   = 1024
    width    = 1024
    steps    = 50
    guidance = 4.0      # true CFG (with a negative prompt): two passes
    max_text = 512
    template = 34       # the prompt template tokens the pipeline drops
    dtype    = bfloat16
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "valid text keys; Qwen-Image masks padding, so this is the prompt's real length"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"

# Qwen2.5-VL-7B (text: 28 layers, 28 heads / 4 KV heads; vision 32 x 1280)
encoder text_encoder = transformers.Qwen2_5_VLForConditionalGeneration from "text_encoder" {
    config {
        text_config: {
            vocab_size: 152064, hidden_size: 3584, intermediate_size: 18944
            num_hidden_layers: 28, num_attention_heads: 28, num_key_value_heads: 4
            max_position_embeddings: 128000, rms_norm_eps: 0.000001, rope_theta: 1000000.0
            tie_word_embeddings: false
        }
        vision_config: { depth: 32, hidden_size: 1280, out_hidden_size: 3584 }
        tie_word_embeddings: false
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer" max_length max_text + template
    input  input_ids: int64[1, max_text + template]
    output prompt_embeds: dtype[1, max_text + template, 3584] select "hidden_states"
}

# 60 double-stream blocks, 24 heads x 128, no single-stream blocks
denoiser transformer = diffusers.QwenImageTransformer2DModel from "transformer" {
    config {
        patch_size: 2, in_channels: 64, out_channels: 16, num_layers: 60
        attention_head_dim: 128, num_attention_heads: 24, joint_attention_dim: 3584
        guidance_embeds: false, axes_dims_rope: [16, 56, 56]
    }
    dtype dtype
    input hidden_states:         dtype[1, (height / 16) * (width / 16), 64]
    input encoder_hidden_states: dtype[1, max_text, 3584]   # valid rows first; padding masked in the program
    input timestep:              dtype[1]
    input valid_text: runtime valid_text
    output sample: dtype[1, (height / 16) * (width / 16), 64] select 0

    attention "transformer_blocks.*.attn": joint
        heads 24 head_dim 128 order (text, visual) text_mask true valid valid_text
}

decoder vae = diffusers.AutoencoderKLQwenImage from "vae" {
    config { base_dim: 96, z_dim: 16, dim_mult: [1, 2, 4, 4], num_res_blocks: 2 }
    entry decode
    dtype dtype
    input  z: dtype[1, 16, 1, height / 8, width / 8]
    output sample: dtype[1, 3, 1, height, width] select "sample"
}

schedule {
    qwen_image.encode_prompt(text_encoder)
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
