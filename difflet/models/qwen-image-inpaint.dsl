# inpaint (QwenImageInpaintPipeline) on the description below, plus the VAE's encoder program and qwen_image.encode_image.
# Qwen/Qwen-Image at real size (QwenImagePipeline), 1024x1024. Every config comes from the
# checkpoint (`difflet lower --weights DIR`), so this serves any Qwen-Image checkpoint of these
# classes (a fine-tune of other dimensions); without weights it lowers with Qwen-Image's (20B)
# configs, the `default` blocks. Shapes follow the configs as QwenImagePipeline computes them:
# vae_scale_factor = 2 ** len(vae.temperal_downsample) (Qwen-Image: 8), latents of
# transformer.in_channels / 4 channels (= vae.z_dim, 16) packed 2x2 -> in_channels (64) per token,
# so 1024x1024 is (1024 / 16) ** 2 = 4096 visual tokens; the transformer gives
# patch_size ** 2 * out_channels (64) back. Text is the Qwen2.5-VL last decoder layer's hidden
# states (text_config.hidden_size 3584 = transformer.joint_attention_dim), template cropped, at
# most 512 tokens, padding masked. The 20B transformer: 60 double-stream blocks, 24 heads x 128.

model qwen_image_inpaint family qwen_image

profile {
    images   = 1        # inpainting: one input image and its mask (white = repaint)
    mask     = true
    strength = 0.6      # QwenImageInpaintPipeline's default
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
    config from checkpoint default {
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
    output prompt_embeds: dtype[1, max_text + template, text_encoder.text_config.hidden_size] select "hidden_states"
}

# Qwen-Image: 60 double-stream blocks, 24 heads x 128, no single-stream blocks
denoiser transformer = diffusers.QwenImageTransformer2DModel from "transformer" {
    config from checkpoint default {
        patch_size: 2, in_channels: 64, out_channels: 16, num_layers: 60
        attention_head_dim: 128, num_attention_heads: 24, joint_attention_dim: 3584
        guidance_embeds: false, axes_dims_rope: [16, 56, 56]
    }
    dtype dtype
    # pixels / (2 * vae_scale_factor) per side: the VAE's latents packed 2x2 (the pipeline's fixed pack)
    input hidden_states: dtype[1, (height / (2 * 2 ** len(vae.temperal_downsample)))
                                  * (width / (2 * 2 ** len(vae.temperal_downsample))), transformer.in_channels]
    # the encoder's width (lowering checks it against transformer.joint_attention_dim); valid rows
    # first, padding masked in the program
    input encoder_hidden_states: dtype[1, max_text, text_encoder.text_config.hidden_size]
    input timestep:              dtype[1]
    input valid_text: runtime valid_text
    output sample: dtype[1, (height / (2 * 2 ** len(vae.temperal_downsample)))
                            * (width / (2 * 2 ** len(vae.temperal_downsample))),
                         transformer.patch_size ** 2 * transformer.out_channels] select 0

    attention "transformer_blocks.*.attn": joint
        heads transformer.num_attention_heads head_dim transformer.attention_head_dim
        order (text, visual) text_mask true valid valid_text
}

# the same VAE's encoder: the input image (one frame) -> mean | logvar, sampled on the host
encoder vae_encoder = diffusers.AutoencoderKLQwenImage from "vae" {
    config from checkpoint default {
        base_dim: 96, z_dim: 16, dim_mult: [1, 2, 4, 4], num_res_blocks: 2, attn_scales: []
        temperal_downsample: [false, true, true], dropout: 0.0
        latents_mean: [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                       0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]
        latents_std: [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                      3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.916]
    }
    entry encode
    dtype dtype
    input  x: dtype[1, 3, 1, height, width]
    output moments: dtype[1, 2 * vae_encoder.z_dim, 1, height / 2 ** len(vae_encoder.temperal_downsample), width / 2 ** len(vae_encoder.temperal_downsample)] select "latent_dist.parameters"
}

decoder vae = diffusers.AutoencoderKLQwenImage from "vae" {
    config from checkpoint default {
        base_dim: 96, z_dim: 16, dim_mult: [1, 2, 4, 4], num_res_blocks: 2, attn_scales: []
        temperal_downsample: [false, true, true], dropout: 0.0
        latents_mean: [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                       0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]
        latents_std: [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                      3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.916]
    }
    entry decode
    dtype dtype
    input  z: dtype[1, vae.z_dim, 1, height / 2 ** len(vae.temperal_downsample),
                    width / 2 ** len(vae.temperal_downsample)]
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
