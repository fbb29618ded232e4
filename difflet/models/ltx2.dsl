# Lightricks/LTX-2 at real size (LTX2Pipeline), 512x768, 121 frames at 24 fps. Every config comes
# from the checkpoint (`difflet lower --weights DIR`), so this serves any LTX-2 checkpoint of these
# classes (a fine-tune of other dimensions); without weights it lowers with LTX-2's configs, the
# `default` blocks. Shapes follow the configs as LTX2Pipeline computes them: video latents
# [1, transformer.in_channels, (frames - 1) / vae.temporal_compression_ratio + 1,
# height / vae.spatial_compression_ratio, width / vae.spatial_compression_ratio], packed into tokens
# by the transformer's patch sizes; LTX-2: 32x spatial, 8x temporal, 128 channels, patch 1 ->
# [1, 16*16*24 = 6144, 128]. Audio: `audio` latent frames (a profile parameter: the host checks it
# is LTX2Pipeline's round(frames / frame_rate * sample_rate / mel_hop_length / 4)) of
# audio_vae.latent_channels x mel_bins // 4 bins, packed to [1, audio, channels x bins]; LTX-2: 126
# of 8 x 16 -> 128. Text: Gemma-3's num_hidden_layers + 1 hidden states stacked (12B: 49 x 3840
# = 188160) -> connectors (registers replace the left padding), whose video and audio outputs are
# their heads x head_dim wide (30 x 128 = 3840). Keys no config.json states but the classes'
# structure fixes are derived by the ltx2 family (difflet/families/ltx2/facts.py): the video VAE's
# compression ratios when its config does not state them (LTX-2's does), the audio VAE's 4x
# temporal and mel compression and the frames its causal decoder drops (4 * audio - 3 mel
# frames), the vocoder's total_upsample_factor (the product of upsample_factors, 240).

model ltx2 family ltx2

profile {
    height   = 512
    width    = 768
    frames   = 121
    audio    = 126
    steps    = 30
    guidance = 3.0      # true CFG + rescale (the pipeline's STG / modality guidance are not served)
    stg_scale      = 1.0   # LTX2Pipeline's defaults: spatio-temporal guidance (video stream)
    modality_scale = 3.0   # and modality-isolation guidance; a request may set both
    max_text = 1024
    dtype    = bfloat16
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "valid Gemma tokens; the connectors fill padding with registers, so the default is the padded length"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"
runtime guidance_pass: int64 in [0, 2] default 0
    doc "the transformer pass: 0 text-conditioned (CFG), 1 spatio-temporal guidance (STG), 2 modality-isolated"

encoder text_encoder = transformers.Gemma3ForConditionalGeneration from "text_encoder" {
    config from checkpoint default {
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
    # every layer's hidden state and the embeddings', stacked on the last dim and flattened
    output hidden_states: dtype[1, max_text, text_encoder.text_config.hidden_size
                                             * (text_encoder.text_config.num_hidden_layers + 1)] select "hidden_states"
}
encoder connectors = diffusers.pipelines.ltx2.connectors.LTX2TextConnectors from "connectors" {
    config from checkpoint default {
        caption_channels: 3840, text_proj_in_factor: 49
        video_connector_num_attention_heads: 30, video_connector_attention_head_dim: 128
        audio_connector_num_attention_heads: 30, audio_connector_attention_head_dim: 128
    }
    dtype dtype
    input  text_encoder_hidden_states: dtype[1, max_text, connectors.caption_channels * connectors.text_proj_in_factor]
    input  valid_text: runtime valid_text
    output video_text: dtype[1, max_text, connectors.video_connector_num_attention_heads
                                          * connectors.video_connector_attention_head_dim] select 0
    output audio_text: dtype[1, max_text, connectors.audio_connector_num_attention_heads
                                          * connectors.audio_connector_attention_head_dim] select 1
}

# 48 audio-video blocks: video 32 x 128, audio 32 x 64
denoiser transformer = diffusers.LTX2VideoTransformer3DModel from "transformer" {
    config from checkpoint default {
        in_channels: 128, out_channels: 128, patch_size: 1, patch_size_t: 1
        num_attention_heads: 32, attention_head_dim: 128, cross_attention_dim: 4096
        audio_in_channels: 128, audio_out_channels: 128, audio_num_attention_heads: 32
        audio_attention_head_dim: 64, audio_cross_attention_dim: 2048, num_layers: 48
        caption_channels: 3840, qk_norm: "rms_norm_across_heads", rope_type: "split"
    }
    dtype dtype
    # video tokens: latent frames / patch_size_t x latent rows / patch_size x latent columns / patch_size
    # LTX2Pipeline's default spatio_temporal_guidance_blocks; LTX-2.0's blocks ignore it (no
    # perturbed_attn), so its STG pass would repeat the conditional one: ltx2/guidance.py
    options { stg_blocks: [28] }
    input hidden_states: dtype[1, ((frames - 1) / vae.temporal_compression_ratio + 1) / transformer.patch_size_t
                                  * (height / vae.spatial_compression_ratio / transformer.patch_size)
                                  * (width / vae.spatial_compression_ratio / transformer.patch_size),
                               transformer.in_channels]
    input audio_hidden_states:         dtype[1, audio, transformer.audio_in_channels]
    input encoder_hidden_states:       dtype[1, max_text, transformer.caption_channels]
    input audio_encoder_hidden_states: dtype[1, max_text, transformer.caption_channels]
    input timestep:                    float32[1]   # the pipeline passes the fp32 timestep
    input video_coords: float32[1, 3, ((frames - 1) / vae.temporal_compression_ratio + 1) / transformer.patch_size_t
                                      * (height / vae.spatial_compression_ratio / transformer.patch_size)
                                      * (width / vae.spatial_compression_ratio / transformer.patch_size), 2]
    input audio_coords:                float32[1, 1, audio, 2]
    input guidance_pass:               runtime guidance_pass
    output sample: dtype[1, ((frames - 1) / vae.temporal_compression_ratio + 1) / transformer.patch_size_t
                            * (height / vae.spatial_compression_ratio / transformer.patch_size)
                            * (width / vae.spatial_compression_ratio / transformer.patch_size),
                         transformer.out_channels] select 0
    output audio_sample: dtype[1, audio, transformer.audio_out_channels] select 1

    # planning facts for the partitioner (heads, streams); the tp1 program runs diffusers' own
    # attention (registers leave no text padding), Difflet kernels for these sites are not built.
    # The audio<->video cross-attentions run at the audio width (audio heads x audio head_dim).

    attention "transformer_blocks.*.attn1": self
        heads transformer.num_attention_heads head_dim transformer.attention_head_dim
        order (visual) text_mask false valid valid_text
    attention "transformer_blocks.*.audio_attn1": self
        heads transformer.audio_num_attention_heads head_dim transformer.audio_attention_head_dim
        order (audio) text_mask false valid valid_text
    attention "transformer_blocks.*.attn2": cross
        heads transformer.num_attention_heads head_dim transformer.attention_head_dim
        order (visual, text) text_mask false valid valid_text
    attention "transformer_blocks.*.audio_attn2": cross
        heads transformer.audio_num_attention_heads head_dim transformer.audio_attention_head_dim
        order (audio, text) text_mask false valid valid_text
    attention "transformer_blocks.*.audio_to_video_attn": cross
        heads transformer.audio_num_attention_heads head_dim transformer.audio_attention_head_dim
        order (visual, audio) text_mask false valid valid_text
    attention "transformer_blocks.*.video_to_audio_attn": cross
        heads transformer.audio_num_attention_heads head_dim transformer.audio_attention_head_dim
        order (audio, visual) text_mask false valid valid_text
}

decoder vae = diffusers.AutoencoderKLLTX2Video from "vae" {
    config from checkpoint default {
        out_channels: 3, latent_channels: 128, spatial_compression_ratio: 32, temporal_compression_ratio: 8
    }
    entry decode
    dtype dtype
    input  z: dtype[1, vae.latent_channels, (frames - 1) / vae.temporal_compression_ratio + 1,
                    height / vae.spatial_compression_ratio, width / vae.spatial_compression_ratio]
    output sample: dtype[1, vae.out_channels, frames, height, width] select "sample"
}

# audio: 126 latent frames -> mel (4 * 126 - 3 frames of 64 bins, stereo) -> 24 kHz waveform
decoder audio_vae = diffusers.AutoencoderKLLTX2Audio from "audio_vae" {
    config from checkpoint default {
        latent_channels: 8, mel_bins: 64, output_channels: 2, sample_rate: 16000, mel_hop_length: 160
    }
    entry decode
    dtype dtype
    # denormalized in float32 as the pipeline does
    input  z: float32[1, audio_vae.latent_channels, audio, audio_vae.mel_bins // audio_vae.mel_compression_ratio]
    output mel: dtype[1, audio_vae.output_channels,
                      audio * audio_vae.temporal_compression_ratio - audio_vae.decoded_frames_trim,
                      audio_vae.mel_bins] select "sample"
}

decoder vocoder = diffusers.pipelines.ltx2.vocoder.LTX2Vocoder from "vocoder" {
    config from checkpoint default {
        in_channels: 128, hidden_channels: 1024, out_channels: 2, upsample_factors: [6, 5, 2, 2, 2]
        upsample_kernel_sizes: [16, 15, 8, 4, 4], output_sampling_rate: 24000
    }
    dtype dtype
    # the audio VAE's mel: its channels x mel bins are the vocoder's in_channels
    input  hidden_states: dtype[1, audio_vae.output_channels,
                                audio * audio_vae.temporal_compression_ratio - audio_vae.decoded_frames_trim,
                                audio_vae.mel_bins]
    output waveform: dtype[1, vocoder.out_channels, vocoder.total_upsample_factor
                           * (audio * audio_vae.temporal_compression_ratio - audio_vae.decoded_frames_trim)] select 0
}

schedule {
    ltx2.encode_prompt(text_encoder, connectors)
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
