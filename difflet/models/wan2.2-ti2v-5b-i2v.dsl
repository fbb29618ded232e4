# Wan-AI/Wan2.2-TI2V-5B-Diffusers at real size, image to video (WanImageToVideoPipeline with
# expand_timesteps, the checkpoint loaded into that pipeline as diffusers' docs do): wan2.2-ti2v-5b's
# text encoder, transformer and residual VAE decoder, plus the VAE's encoder program for the image
# alone. The image's normalized latent (the mode: no draw) replaces latent frame 0 before every
# transformer call and after the last step; the transformer takes t per token, 0 on frame 0's
# tokens (the pipeline's first_frame_mask[0][0][:, ::2, ::2] * t). No CLIP encoder: the 5B
# transformer has no image_dim. Defaults as wan2.2-ti2v-5b.dsl (the Wan team's wan_ti2v_5B.py).

model wan22_ti2v_5b_i2v family wan

profile {
    height   = 704
    width    = 1280
    frames   = 121
    steps    = 50
    guidance = 5.0      # true CFG (cond, uncond)
    max_text = 512
    dtype    = bfloat16
    images   = 1        # image-to-video: one input image, the first frame (no strength)
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

# 30 blocks of 24 heads x 128: self-attention over visual tokens, cross-attention to text, FFN
# 14336. The sites describe the attention to the planner; with no text mask they keep diffusers'
# processors, and nothing crosses per request (the text is zero-padded, attended unmasked).
denoiser transformer = diffusers.WanTransformer3DModel from "transformer" {
    config from checkpoint default {
        patch_size: [1, 2, 2], num_attention_heads: 24, attention_head_dim: 128
        in_channels: 48, out_channels: 48, text_dim: 4096, freq_dim: 256, ffn_dim: 14336
        num_layers: 30, cross_attn_norm: true, qk_norm: "rms_norm_across_heads", eps: 0.000001
        image_dim: null, added_kv_proj_dim: null, rope_max_seq_len: 1024
    }
    dtype dtype
    # latent frames (frames - 1) / temporal scale + 1, pixels / spatial scale per side
    input hidden_states: dtype[1, transformer.in_channels, (frames - 1) / vae.scale_factor_temporal + 1,
                               height / vae.scale_factor_spatial, width / vae.scale_factor_spatial]
    # t per token (float32, as the pipeline's mask x t): latent frames x (h / 2) x (w / 2), patch (1, 2, 2)
    input timestep: float32[1, ((frames - 1) / vae.scale_factor_temporal + 1)
                               * (height / vae.scale_factor_spatial / 2) * (width / vae.scale_factor_spatial / 2)]
    input encoder_hidden_states: dtype[1, max_text, text_encoder.d_model]
    output sample: dtype[1, transformer.out_channels, (frames - 1) / vae.scale_factor_temporal + 1,
                         height / vae.scale_factor_spatial, width / vae.scale_factor_spatial] select 0

    attention "blocks.*.attn1": self
        heads transformer.num_attention_heads head_dim transformer.attention_head_dim
        order (visual) text_mask false
    attention "blocks.*.attn2": cross
        heads transformer.num_attention_heads head_dim transformer.attention_head_dim
        order (visual, text) text_mask false
}

# The image alone (one frame, the pipeline's video_condition under expand_timesteps):
# AutoencoderKLWan.encode traced as is (patchify, then its first chunk).
encoder vae_encoder = diffusers.AutoencoderKLWan from "vae" {
    config from checkpoint default {
        base_dim: 160, decoder_base_dim: 256, z_dim: 48, dim_mult: [1, 2, 4, 4], num_res_blocks: 2
        attn_scales: [], temperal_downsample: [false, true, true], dropout: 0.0, is_residual: true
        in_channels: 12, out_channels: 12, patch_size: 2, scale_factor_spatial: 16, scale_factor_temporal: 4
        latents_mean: [-0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
                      -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
                      -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
                      -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
                      -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
                      0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667]
        latents_std: [0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
                     0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
                     0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
                     0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
                     0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
                     0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744]
    }
    entry encode
    dtype float32
    input  x: float32[1, 3, 1, height, width]
    output moments: float32[1, 2 * vae_encoder.z_dim, 1, height / vae_encoder.scale_factor_spatial,
                            width / vae_encoder.scale_factor_spatial]
        select "latent_dist.parameters"
}

# One latent frame per call; `first` = 1 for latent frame 0 (diffusers' first chunk: one video
# frame, sample[:, :, 0], the rest zeros; caches in not read), else scale_factor_temporal video
# frames. cache<k>: the causal caches at spatial level k (latent, 2x, 4x, 8x: the decoder works on
# 2x2 patches, so its last level is half the output size), two frames each,
# channels summed over that level's convs in decoder order (the wrapper checks them against the
# model).
decoder vae = diffusers.AutoencoderKLWan from "vae" {
    config from checkpoint default {
        base_dim: 160, decoder_base_dim: 256, z_dim: 48, dim_mult: [1, 2, 4, 4], num_res_blocks: 2
        attn_scales: [], temperal_downsample: [false, true, true], dropout: 0.0, is_residual: true
        in_channels: 12, out_channels: 12, patch_size: 2, scale_factor_spatial: 16, scale_factor_temporal: 4
        latents_mean: [-0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
                      -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
                      -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
                      -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
                      -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
                      0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667]
        latents_std: [0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
                     0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
                     0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
                     0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
                     0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
                     0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744]
    }
    entry decode   # wrapped: difflet/families/wan/vae.py
    dtype float32
    input  z: float32[1, vae.z_dim, 1, height / vae.scale_factor_spatial, width / vae.scale_factor_spatial]
    input  first: runtime first
    input  cache0: float32[1, vae.cache0_channels, 2, height / vae.scale_factor_spatial,
                           width / vae.scale_factor_spatial]
    input  cache1: float32[1, vae.cache1_channels, 2, height / vae.scale_factor_spatial * 2,
                           width / vae.scale_factor_spatial * 2]
    input  cache2: float32[1, vae.cache2_channels, 2, height / vae.scale_factor_spatial * 4,
                           width / vae.scale_factor_spatial * 4]
    input  cache3: float32[1, vae.cache3_channels, 2, height / vae.scale_factor_spatial * 8,
                           width / vae.scale_factor_spatial * 8]
    output sample: float32[1, 3, vae.scale_factor_temporal, height, width] select 0
    output next_cache0: float32[1, vae.cache0_channels, 2, height / vae.scale_factor_spatial,
                                width / vae.scale_factor_spatial] select 1
    output next_cache1: float32[1, vae.cache1_channels, 2, height / vae.scale_factor_spatial * 2,
                                width / vae.scale_factor_spatial * 2] select 2
    output next_cache2: float32[1, vae.cache2_channels, 2, height / vae.scale_factor_spatial * 4,
                                width / vae.scale_factor_spatial * 4] select 3
    output next_cache3: float32[1, vae.cache3_channels, 2, height / vae.scale_factor_spatial * 8,
                                width / vae.scale_factor_spatial * 8] select 4
}

schedule {
    wan.encode_prompt(text_encoder)
    wan.encode_image(vae_encoder)
    wan.prepare_latents()
    wan.denoise(transformer) {
        scheduler: diffusers.UniPCMultistepScheduler {
            prediction_type: "flow_prediction", use_flow_sigmas: true, flow_shift: 5.0
            solver_order: 2, solver_type: "bh2", num_train_timesteps: 1000
        }
        guidance: { mode: "cfg", scale: guidance }
        expand_timesteps: true   # t per token, frame 0 blended from the image's latent
    }
    wan.decode(vae) { fps: 24.0 }
}
