# Wan-AI/Wan2.1-T2V-14B-Diffusers at real size (WanPipeline), 81 frames at 480x832.
# VAE: 8x spatial, 4x temporal, 16 latent channels -> latents [1, 16, 21, 60, 104];
# patch (1, 2, 2) -> 21 x 30 x 52 = 32,760 visual tokens. Text: UMT5, cut to the prompt and
# zero-padded to 512, attended unmasked by cross-attention only (no text stream).
# Host steps: difflet/runtime/host/wan.py; program hooks: difflet/codegen/family/wan*.py. The
# encoder masks from its valid_text input (the prompt's token count) and zeroes rows past it.
# The VAE decodes one latent frame per call with its causal caches as explicit tensors (frame
# 0 -> 1 video frame, every later one -> 4; see models/wan2.1-tiny.dsl), so the decoder program
# does not depend on the clip length.

model wan21_t2v_14b family wan

profile {
    height   = 480
    width    = 832
    frames   = 81
    steps    = 50
    guidance = 5.0      # true CFG: two passes (cond, uncond)
    max_text = 512
    dtype    = bfloat16
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "the prompt's UMT5 token count: the encoder masks the padding after it and zeroes its rows"
runtime first: int64 in [0, 1] default 0
    doc "1 for the VAE chunk of latent frame 0 (diffusers' first chunk), else 0"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"

# google/umt5-xxl, encoder only
encoder text_encoder = transformers.UMT5EncoderModel from "text_encoder" {
    config {
        vocab_size: 256384, d_model: 4096, d_ff: 10240, d_kv: 64, num_layers: 24, num_heads: 64
        relative_attention_num_buckets: 32, relative_attention_max_distance: 128
        feed_forward_proj: "gated-gelu", layer_norm_epsilon: 0.000001, dropout_rate: 0.1
        pad_token_id: 0, eos_token_id: 1, decoder_start_token_id: 0
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer" max_length max_text
    input  input_ids: int64[1, max_text]
    input  valid_text: runtime valid_text   # the mask is built in the program
    output prompt_embeds: dtype[1, max_text, 4096] select "last_hidden_state"
}

# 40 blocks: self-attention over visual tokens, cross-attention to text, FFN 13824. The sites
# describe the attention to the planner; with no text mask they keep diffusers' processors, and
# nothing crosses per request (the text is zero-padded, attended unmasked).
denoiser transformer = diffusers.WanTransformer3DModel from "transformer" {
    config {
        patch_size: [1, 2, 2], num_attention_heads: 40, attention_head_dim: 128
        in_channels: 16, out_channels: 16, text_dim: 4096, freq_dim: 256, ffn_dim: 13824
        num_layers: 40, cross_attn_norm: true, qk_norm: "rms_norm_across_heads", eps: 0.000001
    }
    dtype dtype
    input hidden_states:         dtype[1, 16, (frames - 1) / 4 + 1, height / 8, width / 8]
    input timestep:              dtype[1]
    input encoder_hidden_states: dtype[1, max_text, 4096]
    output sample: dtype[1, 16, (frames - 1) / 4 + 1, height / 8, width / 8] select 0

    attention "blocks.*.attn1": self heads 40 head_dim 128 order (visual) text_mask false
    attention "blocks.*.attn2": cross heads 40 head_dim 128 order (visual, text) text_mask false
}

# One latent frame per call; `first` = 1 for latent frame 0 (diffusers' first chunk: one video
# frame, sample[:, :, 0], the rest zeros; caches in not read), else 4 video frames. cache<k>: the
# causal caches at spatial level k (latent, 2x, 4x, 8x), two frames each, channels summed over
# that level's convs in decoder order (the wrapper checks them against the model).
decoder vae = diffusers.AutoencoderKLWan from "vae" {
    config {
        base_dim: 96, z_dim: 16, dim_mult: [1, 2, 4, 4], num_res_blocks: 2
        temperal_downsample: [false, true, true]
    }
    entry decode   # wrapped: difflet/codegen/family/wan_vae.py
    dtype float32
    input  z: float32[1, 16, 1, height / 8, width / 8]
    input  first: runtime first
    input  cache0: float32[1, 4240, 2, height / 8, width / 8]
    input  cache1: float32[1, 2496, 2, height / 4, width / 4]
    input  cache2: float32[1, 1152, 2, height / 2, width / 2]
    input  cache3: float32[1, 672, 2, height, width]
    output sample: float32[1, 3, 4, height, width] select 0
    output next_cache0: float32[1, 4240, 2, height / 8, width / 8] select 1
    output next_cache1: float32[1, 2496, 2, height / 4, width / 4] select 2
    output next_cache2: float32[1, 1152, 2, height / 2, width / 2] select 3
    output next_cache3: float32[1, 672, 2, height, width] select 4
}

schedule {
    wan.encode_prompt(text_encoder)
    wan.prepare_latents()
    wan.denoise(transformer) {
        scheduler: diffusers.UniPCMultistepScheduler {
            prediction_type: "flow_prediction", use_flow_sigmas: true, flow_shift: 3.0
            solver_order: 2, solver_type: "bh2", num_train_timesteps: 1000
        }
        guidance: { mode: "cfg", scale: guidance }
    }
    wan.decode(vae)
}
