# Wan 2.2 TI2V-5B image to video in miniature (WanImageToVideoPipeline with expand_timesteps, as
# diffusers runs Wan2.2-TI2V-5B-Diffusers on an image): wan2.2-tiny-ti2v's text encoder, transformer
# and residual VAE, plus the VAE's encoder program for the image alone. The image's normalized
# latent (no draw: the mode) replaces latent frame 0 before every transformer call and after the
# last step, and the transformer takes t per token: 0 for frame 0's tokens, the step's t for the
# rest. 9 frames at 64x64 -> latents [1, 6, 3, 4, 4]; patch (1, 2, 2) -> 3 x 2 x 2 = 12 tokens.

model wan22_tiny_ti2v_i2v family wan

profile {
    height   = 64
    width    = 64
    frames   = 9
    steps    = 4
    guidance = 5.0      # true CFG (cond, uncond)
    max_text = 16
    dtype    = float32
    images   = 1        # image-to-video: one input image, the first frame (no strength)
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "the prompt's UMT5 token count: the encoder masks the padding after it and zeroes its rows"
runtime first: int64 in [0, 1] default 0
    doc "1 for the VAE chunk of latent frame 0 (diffusers' first chunk), else 0"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"

encoder text_encoder = transformers.UMT5EncoderModel from "text_encoder" {
    config {
        vocab_size: 1000, d_model: 32, d_ff: 37, d_kv: 8, num_layers: 2, num_heads: 4
        relative_attention_num_buckets: 8, feed_forward_proj: "gated-gelu"
        pad_token_id: 0, eos_token_id: 1, decoder_start_token_id: 0
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer" max_length max_text
    input  input_ids: int64[1, max_text]
    input  valid_text: runtime valid_text   # the mask is built in the program
    output prompt_embeds: dtype[1, max_text, 32] select "last_hidden_state"
}

denoiser transformer = diffusers.WanTransformer3DModel from "transformer" {
    config {
        patch_size: [1, 2, 2], num_attention_heads: 2, attention_head_dim: 16
        in_channels: 6, out_channels: 6, text_dim: 32, freq_dim: 32, ffn_dim: 64
        num_layers: 2, cross_attn_norm: true, qk_norm: "rms_norm_across_heads", eps: 0.000001
    }
    dtype dtype
    input hidden_states:         dtype[1, 6, (frames - 1) / 4 + 1, height / 16, width / 16]
    # t per token (WanImageToVideoPipeline's expand_timesteps): latent frames x (h / 2) x (w / 2)
    input timestep:              float32[1, ((frames - 1) / 4 + 1) * (height / 32) * (width / 32)]
    input encoder_hidden_states: dtype[1, max_text, 32]
    output sample: dtype[1, 6, (frames - 1) / 4 + 1, height / 16, width / 16] select 0

    # planner facts, as in wan2.1.dsl: no text mask, so diffusers' processors stay
    attention "blocks.*.attn1": self heads 2 head_dim 16 order (visual) text_mask false
    attention "blocks.*.attn2": cross heads 2 head_dim 16 order (visual, text) text_mask false
}

# The image alone (one frame, the pipeline's video_condition under expand_timesteps):
# AutoencoderKLWan.encode traced as is (patchify, then its first chunk). One resnet per block, here
# and in the decoder (one checkpoint): diffusers' residual encoder does not build with none.
encoder vae_encoder = diffusers.AutoencoderKLWan from "vae" {
    config {
        base_dim: 8, decoder_base_dim: 12, z_dim: 6, dim_mult: [1, 2, 4, 4], num_res_blocks: 1
        temperal_downsample: [false, true, true], is_residual: true, in_channels: 12, out_channels: 12
        patch_size: 2, scale_factor_spatial: 16, scale_factor_temporal: 4
        latents_mean: [0.1, -0.2, 0.3, 0.0, 0.05, -0.1], latents_std: [1.5, 0.8, 1.2, 2.0, 1.1, 0.9]
    }
    entry encode
    dtype float32
    input  x: float32[1, 3, 1, height, width]
    output moments: float32[1, 12, 1, height / 16, width / 16] select "latent_dist.parameters"
}

# One latent frame per call; `first` = 1 for latent frame 0 (diffusers' first chunk: one video
# frame, sample[:, :, 0], the rest zeros; caches in not read), else 4 video frames. cache<k>: the
# causal caches at spatial level k (latent, 2x, 4x, 8x: the decoder works on 2x2 patches, so its
# last level is half the output size), two frames each, channels summed over that level's convs in
# decoder order (the wrapper checks them against the model). Up blocks keep their channels here
# (residual VAE) and one resnet per block, so the sums differ from wan2.2-tiny-ti2v's.
decoder vae = diffusers.AutoencoderKLWan from "vae" {
    config {
        base_dim: 8, decoder_base_dim: 12, z_dim: 6, dim_mult: [1, 2, 4, 4], num_res_blocks: 1
        temperal_downsample: [false, true, true], is_residual: true, in_channels: 12, out_channels: 12
        patch_size: 2, scale_factor_spatial: 16, scale_factor_temporal: 4
        latents_mean: [0.1, -0.2, 0.3, 0.0, 0.05, -0.1], latents_std: [1.5, 0.8, 1.2, 2.0, 1.1, 0.9]
    }
    entry decode   # wrapped: difflet/families/wan/vae.py
    dtype float32
    input  z: float32[1, 6, 1, height / 16, width / 16]
    input  first: runtime first
    input  cache0: float32[1, 438, 2, height / 16, width / 16]
    input  cache1: float32[1, 240, 2, height / 8, width / 8]
    input  cache2: float32[1, 120, 2, height / 4, width / 4]
    input  cache3: float32[1, 72, 2, height / 2, width / 2]
    output sample: float32[1, 3, 4, height, width] select 0
    output next_cache0: float32[1, 438, 2, height / 16, width / 16] select 1
    output next_cache1: float32[1, 240, 2, height / 8, width / 8] select 2
    output next_cache2: float32[1, 120, 2, height / 4, width / 4] select 3
    output next_cache3: float32[1, 72, 2, height / 2, width / 2] select 4
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
