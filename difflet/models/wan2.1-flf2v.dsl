# Wan-AI/Wan2.1-FLF2V-14B-720P-Diffusers at real size: first-last-frame to video
# (WanImageToVideoPipeline with `last_image`), 81 frames at 720x1280: models/wan2.1-i2v.dsl's
# programs, with the CLIP encoder reading both images as one batch of 2 (the pipeline's
# encode_image([image, last_image])) and the FLF2V transformer (pos_embed_seq_len 514 = 2 x 257:
# its image embedder views the two images' tokens as one sequence and adds a position embedding;
# diffusers' convert_wan_to_diffusers.py "Wan-FLF2V-14B-720P"). The condition clip is the first
# image, 79 zero frames, then the last image; the mask is 1 on the first and the last frame.
# Defaults: the Wan team's generate.py for flf2v-14B (1280*720, 81 frames, 50 steps, guidance 5.0,
# sample_shift 16) and the scheduler convert_wan_to_diffusers.py writes for FLF2V (UniPC,
# flow_shift 16.0). Every config comes from the checkpoint (`difflet lower --weights DIR`).

model wan21_flf2v_14b_720p family wan

profile {
    height   = 720
    width    = 1280
    frames   = 81
    steps    = 50
    guidance = 5.0      # true CFG: two passes (cond, uncond)
    max_text = 512
    dtype    = bfloat16
    images   = 2        # the first and the last frame (no strength)
    last_image = true   # both required: the second is the clip's last frame
    image_original = true  # CLIP's processor reads the images as given (resized and cropped to 224)
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "the prompt's UMT5 token count: the encoder masks the padding after it and zeroes its rows"
runtime first: int64 in [0, 1] default 0
    doc "1 for the VAE chunk of latent frame 0 (diffusers' first chunk), else 0"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"

# google/umt5-xxl, encoder only
encoder text_encoder = transformers.UMT5EncoderModel from "text_encoder" {
    config from checkpoint default {
        vocab_size: 256384, d_model: 4096, d_ff: 10240, d_kv: 64, num_layers: 24, num_heads: 64
        relative_attention_num_buckets: 32, relative_attention_max_distance: 128
        feed_forward_proj: "gated-gelu", layer_norm_epsilon: 0.000001, dropout_rate: 0.1
        pad_token_id: 0, eos_token_id: 1, decoder_start_token_id: 0
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer" max_length max_text
    input  input_ids: int64[1, max_text]
    input  valid_text: runtime valid_text   # the mask is built in the program
    output prompt_embeds: dtype[1, max_text, text_encoder.d_model] select "last_hidden_state"
}

# laion/CLIP-ViT-H-14's vision tower, fp32 as the pipeline's example loads it; the pipeline reads
# image_encoder(pixel_values, output_hidden_states=True).hidden_states[-2]
encoder image_encoder = transformers.CLIPVisionModel from "image_encoder" {
    config from checkpoint default {
        hidden_size: 1280, intermediate_size: 5120, num_hidden_layers: 32, num_attention_heads: 16
        image_size: 224, patch_size: 14, projection_dim: 1024, hidden_act: "gelu", layer_norm_eps: 0.00001
    }
    dtype float32
    input  pixel_values: float32[2, 3, image_encoder.image_size, image_encoder.image_size]  # both images' crops, on the host
    output image_embeds: float32[2, (image_encoder.image_size / image_encoder.patch_size) ** 2 + 1,
                                 image_encoder.hidden_size] select "hidden_states.-2"
}

# 40 blocks of 40 heads x 128: self-attention over visual tokens, cross-attention to text, FFN
# 13824. The sites describe the attention to the planner; with no text mask they keep diffusers'
# processors, and nothing crosses per request (the text is zero-padded, attended unmasked).
denoiser transformer = diffusers.WanTransformer3DModel from "transformer" {
    config from checkpoint default {
        patch_size: [1, 2, 2], num_attention_heads: 40, attention_head_dim: 128
        in_channels: 36, out_channels: 16, text_dim: 4096, freq_dim: 256, ffn_dim: 13824
        num_layers: 40, cross_attn_norm: true, qk_norm: "rms_norm_across_heads", eps: 0.000001
        image_dim: 1280, added_kv_proj_dim: 5120, rope_max_seq_len: 1024, pos_embed_seq_len: 514
    }
    dtype dtype
    # [latents | mask | condition]: latent frames (frames - 1) / temporal scale + 1, pixels / spatial scale per side
    input hidden_states: dtype[1, transformer.in_channels, (frames - 1) / vae.scale_factor_temporal + 1,
                               height / 2 ** (len(vae.dim_mult) - 1), width / 2 ** (len(vae.dim_mult) - 1)]
    input timestep:              float32[1]   # the pipeline passes the scheduler's int64 t (999, not bf16's 1000)
    input encoder_hidden_states: dtype[1, max_text, text_encoder.d_model]
    input encoder_hidden_states_image: dtype[2, (image_encoder.image_size / image_encoder.patch_size) ** 2 + 1,
                                             transformer.image_dim]
    output sample: dtype[1, transformer.out_channels, (frames - 1) / vae.scale_factor_temporal + 1,
                         height / 2 ** (len(vae.dim_mult) - 1), width / 2 ** (len(vae.dim_mult) - 1)] select 0

    attention "blocks.*.attn1": self
        heads transformer.num_attention_heads head_dim transformer.attention_head_dim
        order (visual) text_mask false
    attention "blocks.*.attn2": cross
        heads transformer.num_attention_heads head_dim transformer.attention_head_dim
        order (visual, text) text_mask false
}

# The whole conditioning clip (the first image, frames - 2 zero frames, the last image) in one
# call: AutoencoderKLWan.encode traced as is runs diffusers' own chunk loop (frame 0, then 4-frame
# chunks through its feature cache), so the program is the reference's computation op for op.
encoder vae_encoder = diffusers.AutoencoderKLWan from "vae" {
    config from checkpoint default {
        base_dim: 96, z_dim: 16, dim_mult: [1, 2, 4, 4], num_res_blocks: 2, attn_scales: []
        temperal_downsample: [false, true, true], dropout: 0.0
        latents_mean: [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                       0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]
        latents_std: [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                      3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.916]
    }
    entry encode
    dtype float32
    input  x: float32[1, 3, frames, height, width]
    output moments: float32[1, 2 * vae_encoder.z_dim, (frames - 1) / vae_encoder.scale_factor_temporal + 1,
                            height / 2 ** (len(vae_encoder.dim_mult) - 1),
                            width / 2 ** (len(vae_encoder.dim_mult) - 1)] select "latent_dist.parameters"
}

# One latent frame per call; `first` = 1 for latent frame 0 (diffusers' first chunk: one video
# frame, sample[:, :, 0], the rest zeros; caches in not read), else scale_factor_temporal video
# frames. cache<k>: the causal caches at spatial level k (latent, 2x, 4x, 8x), two frames each,
# channels summed over that level's convs in decoder order (the wrapper checks them against the
# model).
decoder vae = diffusers.AutoencoderKLWan from "vae" {
    config from checkpoint default {
        base_dim: 96, z_dim: 16, dim_mult: [1, 2, 4, 4], num_res_blocks: 2, attn_scales: []
        temperal_downsample: [false, true, true], dropout: 0.0
        latents_mean: [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                       0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]
        latents_std: [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                      3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.916]
    }
    entry decode   # wrapped: difflet/families/wan/vae.py
    dtype float32
    input  z: float32[1, vae.z_dim, 1, height / 2 ** (len(vae.dim_mult) - 1), width / 2 ** (len(vae.dim_mult) - 1)]
    input  first: runtime first
    input  cache0: float32[1, vae.cache0_channels, 2, height / 2 ** (len(vae.dim_mult) - 1),
                           width / 2 ** (len(vae.dim_mult) - 1)]
    input  cache1: float32[1, vae.cache1_channels, 2, height / 2 ** (len(vae.dim_mult) - 2),
                           width / 2 ** (len(vae.dim_mult) - 2)]
    input  cache2: float32[1, vae.cache2_channels, 2, height / 2 ** (len(vae.dim_mult) - 3),
                           width / 2 ** (len(vae.dim_mult) - 3)]
    input  cache3: float32[1, vae.cache3_channels, 2, height / 2 ** (len(vae.dim_mult) - 4),
                           width / 2 ** (len(vae.dim_mult) - 4)]
    output sample: float32[1, 3, vae.scale_factor_temporal, height, width] select 0
    output next_cache0: float32[1, vae.cache0_channels, 2, height / 2 ** (len(vae.dim_mult) - 1),
                                width / 2 ** (len(vae.dim_mult) - 1)] select 1
    output next_cache1: float32[1, vae.cache1_channels, 2, height / 2 ** (len(vae.dim_mult) - 2),
                                width / 2 ** (len(vae.dim_mult) - 2)] select 2
    output next_cache2: float32[1, vae.cache2_channels, 2, height / 2 ** (len(vae.dim_mult) - 3),
                                width / 2 ** (len(vae.dim_mult) - 3)] select 3
    output next_cache3: float32[1, vae.cache3_channels, 2, height / 2 ** (len(vae.dim_mult) - 4),
                                width / 2 ** (len(vae.dim_mult) - 4)] select 4
}

schedule {
    wan.encode_prompt(text_encoder)
    wan.encode_image(image_encoder, vae_encoder)
    wan.prepare_latents()
    wan.denoise(transformer) {
        scheduler: diffusers.UniPCMultistepScheduler {
            prediction_type: "flow_prediction", use_flow_sigmas: true, flow_shift: 16.0
            solver_order: 2, solver_type: "bh2", num_train_timesteps: 1000
        }
        guidance: { mode: "cfg", scale: guidance }
    }
    wan.decode(vae)
}
