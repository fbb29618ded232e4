# expect: 4:1: unknown model family 'fluxx' (registered: flux, qwen_image, wan, hunyuan_video, ltx2, flux2)
# snippet: model mini family fluxx
# A minimal valid FLUX-shaped model: each invalid/*.dsl case is this file broken once.
model mini family fluxx

profile {
    height   = 32
    width    = 32
    steps    = 2
    max_text = 8
    dtype    = float32
}

runtime valid_text: int64 in [1, max_text] default max_text
runtime step: int64 in [0, steps - 1] default 0

denoiser transformer = diffusers.FluxTransformer2DModel from "transformer" {
    config {
        patch_size: 1, in_channels: 16, num_layers: 1, num_single_layers: 1
        attention_head_dim: 16, num_attention_heads: 2, joint_attention_dim: 32
        pooled_projection_dim: 32, guidance_embeds: false, axes_dims_rope: [4, 6, 6]
    }
    input hidden_states: dtype[1, (height / 4) * (width / 4), 16]
    input encoder_hidden_states: dtype[1, max_text, 32]
    input valid_text: runtime valid_text
    output sample: dtype[1, (height / 4) * (width / 4), 16] select 0
    attention "transformer_blocks.*.attn": joint
        heads 2 head_dim 16 order (text, visual) text_mask false valid valid_text
}

decoder vae = diffusers.AutoencoderKL from "vae" {
    config {
        down_block_types: ["DownEncoderBlock2D", "DownEncoderBlock2D"]
        up_block_types: ["UpDecoderBlock2D", "UpDecoderBlock2D"]
        block_out_channels: [8, 16], layers_per_block: 1, latent_channels: 4, norm_num_groups: 4
    }
    entry decode
    input z: dtype[1, 4, height / 2, width / 2]
    output sample: dtype[1, 3, height, width] select "sample"
}

schedule {
    flux.denoise(transformer) {
        scheduler: diffusers.FlowMatchEulerDiscreteScheduler { shift: 3.0 }
    }
    flux.decode(vae)
}
