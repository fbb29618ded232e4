# expect: 25:5: denoiser latent input 'hidden_states' has 6 channels but the config's in_channels is 4
# snippet: input hidden_states: dtype[1, 6, (frames - 1) / 4 + 1, height / 8, width / 8]
# A tiny Wan-shaped model with inline configs: 5-D video latents [B, C, F, H, W], whose channels
# are dim 1 (the transformer patchifies inside). invalid/shape_video_* break it once.
model video_inline family wan

profile {
    height   = 32
    width    = 64
    frames   = 5
    steps    = 2
    max_text = 8
    dtype    = float32
}

runtime valid_text: int64 in [1, max_text] default max_text
runtime step: int64 in [0, steps - 1] default 0

denoiser transformer = diffusers.WanTransformer3DModel from "transformer" {
    config {
        patch_size: [1, 2, 2], num_attention_heads: 2, attention_head_dim: 8
        in_channels: 4, out_channels: 4, text_dim: 16, freq_dim: 16, ffn_dim: 32
        num_layers: 1, qk_norm: "rms_norm_across_heads"
    }
    input hidden_states: dtype[1, 6, (frames - 1) / 4 + 1, height / 8, width / 8]
    input timestep: dtype[1]
    input encoder_hidden_states: dtype[1, max_text, 16]
    input valid_text: runtime valid_text
    output sample: dtype[1, 4, (frames - 1) / 4 + 1, height / 8, width / 8] select 0
    attention "blocks.*.attn1": self heads 2 head_dim 8 order (visual) text_mask false valid valid_text
    attention "blocks.*.attn2": cross heads 2 head_dim 8 order (visual, text) text_mask false valid valid_text
}

schedule {
    wan.denoise(transformer) {
        scheduler: diffusers.UniPCMultistepScheduler { prediction_type: "flow_prediction" }
    }
}
