# hunyuan-video-tiny's structure (the same HunyuanVideoPipeline classes, fp32, CPU) with a denoiser
# large enough that one compiled call costs milliseconds single-threaded, so bench/caching.py
# measures step-cache ratios where the denoiser call, not fixed per-step host work, dominates a
# step (as on real-size models). 2 double + 4 single blocks, 4 heads x 32 = hidden 128; 9 frames
# at 64x64 -> latents [1, 4, 3, 16, 16] -> 3 x 8 x 8 = 192 visual tokens. Encoders and VAE stay
# tiny (not what is measured; the VAE is the tiny whole-clip decode at 64x64 x 9 frames).

model hunyuan_video_bench family hunyuan_video

profile {
    height   = 64
    width    = 64
    frames   = 9
    steps    = 50
    guidance = 6.0      # embedded guidance (x1000 in the pipeline), one pass
    max_text = 16
    template = 95       # the prompt template tokens the pipeline crops (its crop_start)
    clip_len = 77       # the pipeline always tokenizes CLIP to 77
    dtype    = float32
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "valid Llama text keys after the template crop; HunyuanVideo masks its padding"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"

# 3 layers so hidden_states[-3] (the pipeline's skip of 2) is a real layer output
encoder text_encoder = transformers.LlamaModel from "text_encoder" {
    config {
        vocab_size: 1000, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 3
        num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 128
        rms_norm_eps: 0.00001, hidden_act: "silu", bos_token_id: 1, eos_token_id: 2, pad_token_id: 0
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer" max_length max_text + template
    input  input_ids: int64[1, max_text + template]
    output prompt_embeds: dtype[1, max_text + template, 32] select "hidden_states"
}

encoder text_encoder_2 = transformers.CLIPTextModel from "text_encoder_2" {
    config {
        vocab_size: 1000, hidden_size: 32, intermediate_size: 37
        num_hidden_layers: 2, num_attention_heads: 4, max_position_embeddings: 77
        projection_dim: 32, bos_token_id: 1, eos_token_id: 2, pad_token_id: 0
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer_2" max_length clip_len
    input  input_ids: int64[1, clip_len]
    output pooled: dtype[1, 32] select "pooler_output"
}

# 1 refiner + 1 dual-stream + 1 single-stream block, 2 heads x 16; RoPE axes 4 + 6 + 6
denoiser transformer = diffusers.HunyuanVideoTransformer3DModel from "transformer" {
    config {
        in_channels: 4, out_channels: 4, num_attention_heads: 4, attention_head_dim: 32
        num_layers: 2, num_single_layers: 4, num_refiner_layers: 1, mlp_ratio: 4.0
        patch_size: 2, patch_size_t: 1, qk_norm: "rms_norm", guidance_embeds: true
        text_embed_dim: 32, pooled_projection_dim: 32, rope_theta: 256.0
        rope_axes_dim: [8, 12, 12]
    }
    dtype dtype
    input hidden_states:          dtype[1, 4, (frames - 1) / 4 + 1, height / 4, width / 4]
    input timestep:               float32[1]   # the pipeline passes the fp32 timestep
    input encoder_hidden_states:  dtype[1, max_text, 32]
    input pooled_projections:     dtype[1, 32]
    input guidance:               float32[1]
    input valid_text: runtime valid_text
    output sample: dtype[1, 4, (frames - 1) / 4 + 1, height / 4, width / 4] select 0

    # the token refiner's self-attention keeps diffusers' masked attention (mask built in the
    # program from valid_text); the joint sites run Difflet's bounded attention
    attention "transformer_blocks.*.attn": joint
        heads 4 head_dim 32 order (visual, text) text_mask true valid valid_text
    attention "single_transformer_blocks.*.attn": joint
        heads 4 head_dim 32 order (visual, text) text_mask true valid valid_text
}

# Whole-clip decode, compiled at the profile's frame count: AutoencoderKLHunyuanVideo.decode as
# diffusers runs it (its framewise temporal tiling, when latent frames > 4, is traced into the
# program). Not a fixed-size temporal chunk program: the decoder's GroupNorms take statistics over
# every frame of a tile (no causal cache to carry) and the default tiling's tail tiles are shorter
# (61 frames: tiles of 5, 5, 5, 5, 4, 1 latent frames), so each tile length would need a program.
decoder vae = diffusers.AutoencoderKLHunyuanVideo from "vae" {
    config {
        in_channels: 3, out_channels: 3, latent_channels: 4
        down_block_types: ["HunyuanVideoDownBlock3D", "HunyuanVideoDownBlock3D", "HunyuanVideoDownBlock3D"]
        up_block_types: ["HunyuanVideoUpBlock3D", "HunyuanVideoUpBlock3D", "HunyuanVideoUpBlock3D"]
        block_out_channels: [8, 16, 16], layers_per_block: 1, norm_num_groups: 4
        scaling_factor: 0.476986, spatial_compression_ratio: 4, temporal_compression_ratio: 4
    }
    entry decode
    dtype dtype
    input  z: dtype[1, 4, (frames - 1) / 4 + 1, height / 4, width / 4]
    output sample: dtype[1, 3, frames, height, width] select "sample"
}

schedule {
    hunyuan_video.encode_prompt(text_encoder, text_encoder_2)
    hunyuan_video.prepare_latents()
    hunyuan_video.denoise(transformer) {
        scheduler: diffusers.FlowMatchEulerDiscreteScheduler { shift: 7.0, use_dynamic_shifting: false }
        guidance: { mode: "embedded", scale: guidance }
    }
    hunyuan_video.decode(vae)
}
