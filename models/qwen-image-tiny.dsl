# Qwen-Image tiny (QwenImageTransformer2DModel: 2 double-stream blocks, 4 heads x 16, RoPE axes
# 4+6+6): the denoiser tests/test_split_qwen.py checks split vs unsplit diffusers. 4 heads so
# Ulysses fits 4 ranks (heads % (tp*cp) == 0). Latents of 4 channels packed 2x2 -> 16 channels;
# 128x128 with the VAE's 8x -> an 8 x 8 grid of 64 visual tokens. Text padding is MASKED
# (text_mask true): valid_text is the prompt's real length. Only the denoiser is declared: the
# frontend lowers without encoders/decoder, and the denoiser is what the split tests exercise.

model qwen_image_tiny family qwen_image

profile {
    height   = 128
    width    = 128
    steps    = 4
    guidance = 4.0
    max_text = 16
    dtype    = float32
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "valid text keys; Qwen-Image masks padding, so this is the prompt's real length"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"

denoiser transformer = diffusers.QwenImageTransformer2DModel from "transformer" {
    config {
        patch_size: 2, in_channels: 16, out_channels: 4, num_layers: 2
        attention_head_dim: 16, num_attention_heads: 4, joint_attention_dim: 32
        guidance_embeds: false, axes_dims_rope: [4, 6, 6]
    }
    dtype dtype
    input hidden_states:               dtype[1, (height / 16) * (width / 16), 16]
    input encoder_hidden_states:       dtype[1, max_text, 32]
    input encoder_hidden_states_mask:  int64[1, max_text]
    input timestep:                    dtype[1]
    input valid_text: runtime valid_text
    output sample: dtype[1, (height / 16) * (width / 16), 16] select 0

    attention "transformer_blocks.*.attn": joint
        heads 4 head_dim 16 order (text, visual) text_mask true valid valid_text
}

schedule {
    qwen_image.denoise(transformer) {
        scheduler: diffusers.FlowMatchEulerDiscreteScheduler {
            shift: 1.0, use_dynamic_shifting: true, base_shift: 0.5, max_shift: 0.9
            base_image_seq_len: 256, max_image_seq_len: 8192, shift_terminal: 0.02
            time_shift_type: "exponential"
        }
        guidance: { mode: "true_cfg", scale: guidance }
    }
}
