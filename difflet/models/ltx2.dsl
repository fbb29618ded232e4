# Lightricks/LTX-2 at real size (LTX2Pipeline), 512x768, 121 frames at 24 fps; VAE 32x spatial, 8x
# temporal, 128 latent channels -> [1, 16*16*24 = 6144, 128]; audio 126 frames of 8 ch x 16 mel -> 128.
# Text: Gemma-3-12B's 49 stacked hidden states -> connectors (registers replace the left padding).

model ltx2 family ltx2

profile {
    height   = 512
    width    = 768
    frames   = 121
    audio    = 126
    steps    = 30
    guidance = 3.0      # true CFG + rescale (the pipeline's STG / modality guidance are not served)
    max_text = 1024
    dtype    = bfloat16
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "valid Gemma tokens; the connectors fill padding with registers, so the default is the padded length"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"

encoder text_encoder = transformers.Gemma3ForConditionalGeneration from "text_encoder" {
    config {
        text_config: {
            vocab_size: 262208, hidden_size: 3840, intermediate_size: 15360, num_hidden_layers: 48
            num_attention_heads: 16, num_key_value_heads: 8, head_dim: 256
        }
        vision_config: { hidden_size: 1152, intermediate_size: 4304, num_hidden_layers: 27
                         num_attention_heads: 16, image_size: 896, patch_size: 14 }
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer" max_length max_text
    input  input_ids: int64[1, max_text]
    input  valid_text: runtime valid_text
    output hidden_states: dtype[1, max_text, 188160] select "hidden_states"
}
encoder connectors = diffusers.pipelines.ltx2.connectors.LTX2TextConnectors from "connectors" {
    config { caption_channels: 3840, text_proj_in_factor: 49 }
    dtype dtype
    input  text_encoder_hidden_states: dtype[1, max_text, 188160]
    input  valid_text: runtime valid_text
    output video_text: dtype[1, max_text, 3840] select 0
    output audio_text: dtype[1, max_text, 3840] select 1
}

# 48 audio-video blocks: video 32 x 128, audio 32 x 64
denoiser transformer = diffusers.LTX2VideoTransformer3DModel from "transformer" {
    config {
        in_channels: 128, out_channels: 128, patch_size: 1, patch_size_t: 1
        num_attention_heads: 32, attention_head_dim: 128, cross_attention_dim: 4096
        audio_in_channels: 128, audio_out_channels: 128, audio_num_attention_heads: 32
        audio_attention_head_dim: 64, audio_cross_attention_dim: 2048, num_layers: 48
        caption_channels: 3840, qk_norm: "rms_norm_across_heads", rope_type: "split"
    }
    dtype dtype
    input hidden_states:               dtype[1, ((frames - 1) / 8 + 1) * (height / 32) * (width / 32), 128]
    input audio_hidden_states:         dtype[1, audio, 128]
    input encoder_hidden_states:       dtype[1, max_text, 3840]
    input audio_encoder_hidden_states: dtype[1, max_text, 3840]
    input timestep:                    dtype[1]
    input video_coords:                float32[1, 3, ((frames - 1) / 8 + 1) * (height / 32) * (width / 32), 2]
    input audio_coords:                float32[1, 1, audio, 2]
    output sample:       dtype[1, ((frames - 1) / 8 + 1) * (height / 32) * (width / 32), 128] select 0
    output audio_sample: dtype[1, audio, 128] select 1

    # planning facts for the partitioner (heads, streams); the tp1 program runs diffusers' own
    # attention (registers leave no text padding), Difflet kernels for these sites are not built

    attention "transformer_blocks.*.attn1": self heads 32 head_dim 128 order (visual) text_mask false valid valid_text
    attention "transformer_blocks.*.audio_attn1": self heads 32 head_dim 64 order (audio) text_mask false valid valid_text
    attention "transformer_blocks.*.attn2": cross heads 32 head_dim 128 order (visual, text) text_mask false valid valid_text
    attention "transformer_blocks.*.audio_attn2": cross heads 32 head_dim 64 order (audio, text) text_mask false valid valid_text
    attention "transformer_blocks.*.audio_to_video_attn": cross heads 32 head_dim 64 order (visual, audio) text_mask false valid valid_text
    attention "transformer_blocks.*.video_to_audio_attn": cross heads 32 head_dim 64 order (audio, visual) text_mask false valid valid_text
}

decoder vae = diffusers.AutoencoderKLLTX2Video from "vae" {
    config { latent_channels: 128 }
    entry decode
    dtype dtype
    input  z: dtype[1, 128, (frames - 1) / 8 + 1, height / 32, width / 32]
    output sample: dtype[1, 3, frames, height, width] select "sample"
}

# audio: 126 latent frames -> mel (4 * 126 - 3 frames of 64 bins, stereo) -> 24 kHz waveform
decoder audio_vae = diffusers.AutoencoderKLLTX2Audio from "audio_vae" {
    config { latent_channels: 8, mel_bins: 64, output_channels: 2, sample_rate: 16000, mel_hop_length: 160 }
    entry decode
    dtype dtype
    input  z: float32[1, 8, audio, 16]   # denormalized in float32 as the pipeline does
    output mel: dtype[1, 2, 4 * audio - 3, 64] select "sample"
}

decoder vocoder = diffusers.pipelines.ltx2.vocoder.LTX2Vocoder from "vocoder" {
    config {
        in_channels: 128, hidden_channels: 1024, out_channels: 2, upsample_factors: [6, 5, 2, 2, 2]
        upsample_kernel_sizes: [16, 15, 8, 4, 4], output_sampling_rate: 24000
    }
    dtype dtype
    input  hidden_states: dtype[1, 2, 4 * audio - 3, 64]
    output waveform: dtype[1, 2, 240 * (4 * audio - 3)] select 0
}

schedule {
    ltx2.encode_prompt(text_encoder, connectors)
    ltx2.prepare_latents() { frame_rate: 24.0 }
    ltx2.denoise(transformer) {
        scheduler: diffusers.FlowMatchEulerDiscreteScheduler {
            use_dynamic_shifting: true, base_shift: 0.95, max_shift: 2.05
            base_image_seq_len: 1024, max_image_seq_len: 4096, shift_terminal: 0.1, shift: 1.0
        }
        guidance: { mode: "cfg", scale: guidance, audio_scale: 7.0, rescale: 0.7, audio_rescale: 0.7 }
    }
    ltx2.decode(vae, audio_vae, vocoder)
}
