# Wan 2.1 first-last-frame to video (WanImageToVideoPipeline with `last_image`, as diffusers runs
# Wan2.1-FLF2V-14B-720P-Diffusers) in miniature: wan2.1-tiny-i2v's programs, with the CLIP encoder
# reading both images (a batch of 2: the pipeline's encode_image([image, last_image])) and the
# FLF2V transformer's image position embedding over their 2 x 17 tokens (pos_embed_seq_len 34:
# its image embedder views the batch of 2 as one sequence). The condition clip is the first image,
# frames - 2 zero frames, then the last image; the mask is 1 on the first and the last frame.
# The scheduler's flow_shift is diffusers' convert_wan_to_diffusers.py FLF2V value (16.0).

model wan21_tiny_flf2v family wan

profile {
    height   = 32
    width    = 32
    frames   = 9
    steps    = 4
    guidance = 5.0      # true CFG: two passes (cond, uncond)
    max_text = 512      # the I2V transformer's attention assumes 512 text tokens
    dtype    = float32
    images   = 2        # the first and the last frame (no strength)
    last_image = true   # both required: the second is the clip's last frame
    image_original = true  # CLIP's processor reads the images as given (resized and cropped)
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

# the pipeline's encode_image: image_encoder(pixel_values, output_hidden_states=True).hidden_states[-2]
encoder image_encoder = transformers.CLIPVisionModel from "image_encoder" {
    config {
        hidden_size: 32, intermediate_size: 37, num_hidden_layers: 2, num_attention_heads: 4
        image_size: 32, patch_size: 8, projection_dim: 32
    }
    dtype float32
    input  pixel_values: float32[2, 3, 32, 32]      # CLIPImageProcessor's crops of both images, on the host
    output image_embeds: float32[2, 17, 32] select "hidden_states.-2"
}

denoiser transformer = diffusers.WanTransformer3DModel from "transformer" {
    config {
        patch_size: [1, 2, 2], num_attention_heads: 2, attention_head_dim: 16
        in_channels: 12, out_channels: 4, text_dim: 32, freq_dim: 32, ffn_dim: 64
        num_layers: 2, cross_attn_norm: true, qk_norm: "rms_norm_across_heads", eps: 0.000001
        image_dim: 32, added_kv_proj_dim: 32, pos_embed_seq_len: 34
    }
    dtype dtype
    input hidden_states:              dtype[1, 12, (frames - 1) / 4 + 1, height / 8, width / 8]  # latents | mask | condition
    input timestep:                   dtype[1]
    input encoder_hidden_states:      dtype[1, max_text, 32]
    input encoder_hidden_states_image: dtype[2, 17, 32]   # both images' CLIP tokens
    output sample: dtype[1, 4, (frames - 1) / 4 + 1, height / 8, width / 8] select 0

    attention "blocks.*.attn1": self heads 2 head_dim 16 order (visual) text_mask false
    attention "blocks.*.attn2": cross heads 2 head_dim 16 order (visual, text) text_mask false
}

# The whole conditioning clip in one call: AutoencoderKLWan.encode traced as is runs diffusers' own
# chunk loop (frame 0, then 4-frame chunks through its feature cache), so the program is the
# reference's computation op for op; it runs once per request, unlike the decoder's per-frame calls.
encoder vae_encoder = diffusers.AutoencoderKLWan from "vae" {
    config {
        base_dim: 8, z_dim: 4, dim_mult: [1, 2, 4, 4], num_res_blocks: 1
        temperal_downsample: [false, true, true]
        latents_mean: [0.1, -0.2, 0.3, 0.0], latents_std: [1.5, 0.8, 1.2, 2.0]
    }
    entry encode
    dtype float32
    input  x: float32[1, 3, frames, height, width]
    output moments: float32[1, 8, (frames - 1) / 4 + 1, height / 8, width / 8] select "latent_dist.parameters"
}

decoder vae = diffusers.AutoencoderKLWan from "vae" {
    config {
        base_dim: 8, z_dim: 4, dim_mult: [1, 2, 4, 4], num_res_blocks: 1
        temperal_downsample: [false, true, true]
        latents_mean: [0.1, -0.2, 0.3, 0.0], latents_std: [1.5, 0.8, 1.2, 2.0]
    }
    entry decode   # wrapped: difflet/families/wan/vae.py
    dtype float32
    input  z: float32[1, 4, 1, height / 8, width / 8]
    input  first: runtime first
    input  cache0: float32[1, 292, 2, height / 8, width / 8]
    input  cache1: float32[1, 144, 2, height / 4, width / 4]
    input  cache2: float32[1, 64, 2, height / 2, width / 2]
    input  cache3: float32[1, 40, 2, height, width]
    output sample: float32[1, 3, 4, height, width] select 0
    output next_cache0: float32[1, 292, 2, height / 8, width / 8] select 1
    output next_cache1: float32[1, 144, 2, height / 4, width / 4] select 2
    output next_cache2: float32[1, 64, 2, height / 2, width / 2] select 3
    output next_cache3: float32[1, 40, 2, height, width] select 4
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
