# LTX-2 image-to-video (LTX2ImageToVideoPipeline) in miniature: ltx2-tiny's classes and configs
# plus the VAE's encoder program, fp32, for CPU tests. The input image is frame 0: H.264
# re-compressed at the pipeline's CRF from the image as given (image_original), resized to the
# request's size, encoded (the mean: no random draw) and normalized in the program; the start
# latents keep it on latent frame 0 (conditioning mask 1) and noise elsewhere. The transformer
# takes the per-token `video_timestep` t * (1 - mask) beside the step's `timestep` (audio and
# sigma), and after every update the frame-0 tokens are put back, as the pipeline steps only
# latent frames 1: (difflet/families/ltx2/denoise.py). Text, audio and decoding: ltx2-tiny.dsl.

model ltx2_tiny_i2v family ltx2

profile {
    height   = 32
    width    = 32
    frames   = 9
    audio    = 9
    steps    = 2
    guidance = 3.0
    stg_scale      = 1.0   # LTX2Pipeline's defaults: spatio-temporal guidance (video stream)
    modality_scale = 3.0   # and modality-isolation guidance; a request may set both
    max_text = 16
    dtype    = float32
    images   = 1        # image-to-video: one input image, the first frame (no strength)
    image_original = true  # the pipeline re-compresses the image as given, before resizing it
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "valid Gemma tokens (left padded); the encoder masks and the connectors replace the padding"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"
runtime guidance_pass: int64 in [0, 2] default 0
    doc "the transformer pass: 0 text-conditioned (CFG), 1 spatio-temporal guidance (STG), 2 modality-isolated"

encoder text_encoder = transformers.Gemma3ForConditionalGeneration from "text_encoder" {
    config {
        text_config: {
            vocab_size: 1000, hidden_size: 32, intermediate_size: 37, num_hidden_layers: 2
            num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16
            pad_token_id: 0, eos_token_id: 1, bos_token_id: 2
        }
        vision_config: { hidden_size: 16, intermediate_size: 37, num_hidden_layers: 1
                         num_attention_heads: 2, image_size: 28, patch_size: 14 }
        mm_tokens_per_image: 4
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer" max_length max_text
    input  input_ids: int64[1, max_text]
    input  valid_text: runtime valid_text
    output hidden_states: dtype[1, max_text, 96] select "hidden_states"
}

encoder connectors = diffusers.pipelines.ltx2.connectors.LTX2TextConnectors from "connectors" {
    config {
        caption_channels: 32, text_proj_in_factor: 3
        video_connector_num_attention_heads: 2, video_connector_attention_head_dim: 16
        video_connector_num_layers: 1, video_connector_num_learnable_registers: 8
        audio_connector_num_attention_heads: 2, audio_connector_attention_head_dim: 16
        audio_connector_num_layers: 1, audio_connector_num_learnable_registers: 8
        connector_rope_base_seq_len: 32, rope_type: "split"
    }
    dtype dtype
    input  text_encoder_hidden_states: dtype[1, max_text, 96]
    input  valid_text: runtime valid_text
    output video_text: dtype[1, max_text, 32] select 0
    output audio_text: dtype[1, max_text, 32] select 1
}

denoiser transformer = diffusers.LTX2VideoTransformer3DModel from "transformer" {
    config {
        in_channels: 4, out_channels: 4, patch_size: 1, patch_size_t: 1
        num_attention_heads: 2, attention_head_dim: 16, cross_attention_dim: 32
        audio_in_channels: 4, audio_out_channels: 4, audio_num_attention_heads: 2
        audio_attention_head_dim: 8, audio_cross_attention_dim: 16, num_layers: 1
        caption_channels: 32, qk_norm: "rms_norm_across_heads", rope_type: "split"
        vae_scale_factors: [2, 8, 8]
    }
    dtype dtype
    # the STG pass's blocks (perturbed only with config perturbed_attn: ltx2/guidance.py)
    options { stg_blocks: [0] }
    input hidden_states:               dtype[1, ((frames - 1) / 2 + 1) * (height / 8) * (width / 8), 4]
    input audio_hidden_states:         dtype[1, audio, 4]
    input encoder_hidden_states:       dtype[1, max_text, 32]
    input audio_encoder_hidden_states: dtype[1, max_text, 32]
    input timestep:                    dtype[1]   # the audio stream's timestep and sigma
    # the video stream's, per token: t * (1 - conditioning mask), 0 on latent frame 0's 16 tokens
    input video_timestep:              dtype[1, ((frames - 1) / 2 + 1) * (height / 8) * (width / 8)]
    input video_coords:                float32[1, 3, ((frames - 1) / 2 + 1) * (height / 8) * (width / 8), 2]
    input audio_coords:                float32[1, 1, audio, 2]
    input guidance_pass:               runtime guidance_pass
    output sample:       dtype[1, ((frames - 1) / 2 + 1) * (height / 8) * (width / 8), 4] select 0
    output audio_sample: dtype[1, audio, 4] select 1

    # planning facts (heads, streams), as in ltx2.dsl: registers leave no text padding, so the
    # tp1 program keeps diffusers' attention; split programs run family/ltx2_attention.py
    attention "transformer_blocks.*.attn1": self heads 2 head_dim 16 order (visual) text_mask false
    attention "transformer_blocks.*.audio_attn1": self heads 2 head_dim 8 order (audio) text_mask false
    attention "transformer_blocks.*.attn2": cross heads 2 head_dim 16 order (visual, text) text_mask false
    attention "transformer_blocks.*.audio_attn2": cross heads 2 head_dim 8 order (audio, text) text_mask false
    attention "transformer_blocks.*.audio_to_video_attn": cross heads 2 head_dim 8 order (visual, audio) text_mask false
    attention "transformer_blocks.*.video_to_audio_attn": cross heads 2 head_dim 8 order (audio, visual) text_mask false
}

# the pipeline's first-frame encode: vae.encode(image[:, :, None]).latent_dist.mode(), normalized
# by the VAE's latents_mean/std buffers (programs.VideoEncodeProgram)
encoder vae_encoder = diffusers.AutoencoderKLLTX2Video from "vae" {
    config {
        in_channels: 3, out_channels: 3, latent_channels: 4
        block_out_channels: [8], decoder_block_out_channels: [8]
        layers_per_block: [1], decoder_layers_per_block: [1, 1]
        spatio_temporal_scaling: [true], decoder_spatio_temporal_scaling: [true]
        decoder_inject_noise: [false, false], downsample_type: ["spatial"]
        upsample_residual: [false], upsample_factor: [1]
        timestep_conditioning: false, patch_size: 4, patch_size_t: 1
        encoder_causal: true, decoder_causal: false
    }
    entry encode
    dtype dtype
    input  x: dtype[1, 3, 1, height, width]
    output latents: float32[1, 4, 1, height / 8, width / 8] select 0
}

decoder vae = diffusers.AutoencoderKLLTX2Video from "vae" {
    config {
        in_channels: 3, out_channels: 3, latent_channels: 4
        block_out_channels: [8], decoder_block_out_channels: [8]
        layers_per_block: [1], decoder_layers_per_block: [1, 1]
        spatio_temporal_scaling: [true], decoder_spatio_temporal_scaling: [true]
        decoder_inject_noise: [false, false], downsample_type: ["spatial"]
        upsample_residual: [false], upsample_factor: [1]
        timestep_conditioning: false, patch_size: 4, patch_size_t: 1
        encoder_causal: true, decoder_causal: false
    }
    entry decode
    dtype dtype
    input  z: dtype[1, 4, (frames - 1) / 2 + 1, height / 8, width / 8]
    output sample: dtype[1, 3, frames, height, width] select "sample"
}

decoder audio_vae = diffusers.AutoencoderKLLTX2Audio from "audio_vae" {
    config {
        base_channels: 4, output_channels: 2, ch_mult: [1], num_res_blocks: 1
        attn_resolutions: null, in_channels: 2, resolution: 32, latent_channels: 2
        norm_type: "pixel", causality_axis: "height", dropout: 0.0
        mid_block_add_attention: false, sample_rate: 16000, mel_hop_length: 160
        is_causal: true, mel_bins: 8
    }
    entry decode
    dtype dtype
    input  z: dtype[1, 2, audio, 2]
    output mel: dtype[1, 2, 4 * audio - 3, 8] select "sample"
}

decoder vocoder = diffusers.pipelines.ltx2.vocoder.LTX2Vocoder from "vocoder" {
    config {
        in_channels: 16, hidden_channels: 32, out_channels: 2
        upsample_kernel_sizes: [12, 15, 12], upsample_factors: [6, 5, 6]
        resnet_kernel_sizes: [3], resnet_dilations: [[1, 3, 5]]
        leaky_relu_negative_slope: 0.1, output_sampling_rate: 16000
    }
    dtype dtype
    input  hidden_states: dtype[1, 2, 4 * audio - 3, 8]
    output waveform: dtype[1, 2, 180 * (4 * audio - 3)] select 0
}

schedule {
    ltx2.encode_prompt(text_encoder, connectors)
    ltx2.encode_image(vae_encoder)   # image_crf: the pipeline's default (33 for Gemma 3)
    ltx2.prepare_latents() { frame_rate: 24.0 }
    ltx2.denoise(transformer) {
        scheduler: diffusers.FlowMatchEulerDiscreteScheduler {
            use_dynamic_shifting: true, base_shift: 0.95, max_shift: 2.05
            base_image_seq_len: 1024, max_image_seq_len: 4096, shift_terminal: 0.1, shift: 1.0
        }
        guidance: { mode: "cfg", scale: guidance, audio_scale: 7.0, rescale: 0.7, audio_rescale: 0.7,
                    stg_scale: stg_scale, audio_stg_scale: 1.0, modality_scale: modality_scale, audio_modality_scale: 3.0 }
    }
    ltx2.decode(vae, audio_vae, vocoder)
}
