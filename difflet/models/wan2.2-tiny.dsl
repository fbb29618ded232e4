# Wan 2.2 A14B (two experts) in miniature: wan2.1-tiny with WanPipeline's transformer_2 and
# boundary_ratio. The high-noise expert (`transformer`) runs the steps whose timestep is at or above
# boundary_ratio x num_train_timesteps, the low-noise expert (`transformer_2`) the rest, each with
# its own guidance scale; both are resident. Shapes as wan2.1-tiny (see its header).

model wan22_tiny family wan

profile {
    height   = 32
    width    = 32
    frames   = 9
    steps    = 4
    guidance = 4.0      # true CFG (cond, uncond) for the high-noise expert
    guidance_2 = 3.0    # and for the low-noise expert (WanPipeline's guidance_scale_2)
    max_text = 16
    dtype    = float32
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
        in_channels: 4, out_channels: 4, text_dim: 32, freq_dim: 32, ffn_dim: 64
        num_layers: 2, cross_attn_norm: true, qk_norm: "rms_norm_across_heads", eps: 0.000001
    }
    dtype dtype
    input hidden_states:         dtype[1, 4, (frames - 1) / 4 + 1, height / 8, width / 8]
    input timestep:              dtype[1]
    input encoder_hidden_states: dtype[1, max_text, 32]
    output sample: dtype[1, 4, (frames - 1) / 4 + 1, height / 8, width / 8] select 0

    # planner facts, as in wan2.1.dsl: no text mask, so diffusers' processors stay
    attention "blocks.*.attn1": self heads 2 head_dim 16 order (visual) text_mask false
    attention "blocks.*.attn2": cross heads 2 head_dim 16 order (visual, text) text_mask false
}

# the low-noise expert: WanPipeline's transformer_2, the same class and shapes, its own weights
denoiser transformer_2 = diffusers.WanTransformer3DModel from "transformer_2" {
    config {
        patch_size: [1, 2, 2], num_attention_heads: 2, attention_head_dim: 16
        in_channels: 4, out_channels: 4, text_dim: 32, freq_dim: 32, ffn_dim: 64
        num_layers: 2, cross_attn_norm: true, qk_norm: "rms_norm_across_heads", eps: 0.000001
    }
    dtype dtype
    input hidden_states:         dtype[1, 4, (frames - 1) / 4 + 1, height / 8, width / 8]
    input timestep:              dtype[1]
    input encoder_hidden_states: dtype[1, max_text, 32]
    output sample: dtype[1, 4, (frames - 1) / 4 + 1, height / 8, width / 8] select 0

    attention "blocks.*.attn1": self heads 2 head_dim 16 order (visual) text_mask false
    attention "blocks.*.attn2": cross heads 2 head_dim 16 order (visual, text) text_mask false
}

# One latent frame per call; `first` = 1 for latent frame 0 (diffusers' first chunk: one video
# frame, sample[:, :, 0], the rest zeros; caches in not read), else 4 video frames. cache<k>: the
# causal caches at spatial level k (latent, 2x, 4x, 8x), two frames each, channels summed over
# that level's convs in decoder order (the wrapper checks them against the model).
decoder vae = diffusers.AutoencoderKLWan from "vae" {
    config {
        base_dim: 8, z_dim: 4, dim_mult: [1, 2, 4, 4], num_res_blocks: 0
        temperal_downsample: [false, true, true]
        latents_mean: [0.1, -0.2, 0.3, 0.0], latents_std: [1.5, 0.8, 1.2, 2.0]
    }
    entry decode   # wrapped: difflet/codegen/family/wan_vae.py
    dtype float32
    input  z: float32[1, 4, 1, height / 8, width / 8]
    input  first: runtime first
    input  cache0: float32[1, 228, 2, height / 8, width / 8]
    input  cache1: float32[1, 80, 2, height / 4, width / 4]
    input  cache2: float32[1, 32, 2, height / 2, width / 2]
    input  cache3: float32[1, 24, 2, height, width]
    output sample: float32[1, 3, 4, height, width] select 0
    output next_cache0: float32[1, 228, 2, height / 8, width / 8] select 1
    output next_cache1: float32[1, 80, 2, height / 4, width / 4] select 2
    output next_cache2: float32[1, 32, 2, height / 2, width / 2] select 3
    output next_cache3: float32[1, 24, 2, height, width] select 4
}

schedule {
    wan.encode_prompt(text_encoder)
    wan.prepare_latents()
    wan.denoise(transformer, transformer_2) {
        scheduler: diffusers.UniPCMultistepScheduler {
            prediction_type: "flow_prediction", use_flow_sigmas: true, flow_shift: 3.0
            solver_order: 2, solver_type: "bh2", num_train_timesteps: 1000
        }
        guidance: { mode: "cfg", scale: guidance }
        boundary_ratio: 0.875
    }
    wan.decode(vae)
}
