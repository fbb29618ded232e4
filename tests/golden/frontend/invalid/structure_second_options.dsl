# expect: 30:5: a component has one options map; this is a second
# snippet: options { stg_blocks: [1] }
# A tiny LTX-2-shaped model: a video stream (2 heads x 8) and an audio stream with its own
# config keys (audio_num_attention_heads 2 x audio_attention_head_dim 4); sites that involve
# audio are checked against the audio keys. invalid/shape_audio_* break it once.
model audio_video family ltx2

profile {
    height   = 64
    width    = 64
    frames   = 9
    audio    = 6
    steps    = 2
    max_text = 8
    dtype    = float32
}

runtime valid_text: int64 in [1, max_text] default max_text
runtime step: int64 in [0, steps - 1] default 0

denoiser transformer = diffusers.LTX2VideoTransformer3DModel from "transformer" {
    config {
        in_channels: 8, out_channels: 8, patch_size: 1, patch_size_t: 1
        num_attention_heads: 2, attention_head_dim: 8, cross_attention_dim: 16
        audio_in_channels: 8, audio_out_channels: 8, audio_num_attention_heads: 2
        audio_attention_head_dim: 4, audio_cross_attention_dim: 8, num_layers: 1
        caption_channels: 16
    }
    options { stg_blocks: [0] }
    options { stg_blocks: [1] }
    input hidden_states:               dtype[1, ((frames - 1) / 8 + 1) * (height / 32) * (width / 32), 8]
    input audio_hidden_states:         dtype[1, audio, 8]
    input encoder_hidden_states:       dtype[1, max_text, 16]
    input audio_encoder_hidden_states: dtype[1, max_text, 16]
    input timestep:                    dtype[1]
    input valid_text: runtime valid_text
    output sample: dtype[1, ((frames - 1) / 8 + 1) * (height / 32) * (width / 32), 8] select 0
    attention "transformer_blocks.*.attn1": self heads 2 head_dim 8 order (visual) text_mask false valid valid_text
    attention "transformer_blocks.*.audio_attn1": self heads 2 head_dim 4 order (audio) text_mask false valid valid_text
    attention "transformer_blocks.*.audio_to_video_attn": cross heads 2 head_dim 4 order (visual, audio) text_mask false valid valid_text
}

schedule {
    ltx2.denoise(transformer) {
        scheduler: diffusers.FlowMatchEulerDiscreteScheduler { shift: 1.0 }
    }
}
