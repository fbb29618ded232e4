# FLUX.2 [klein] base in miniature (Flux2KleinPipeline, is_distilled false): the same diffusers /
# transformers classes at toy size, fp32, for CPU tests. Text: Qwen3ForCausalLM with 28 layers of
# width 32 (the pipeline stacks the hidden states of layers 9, 18 and 27 per token: 96 wide), run
# with the prompt's padding mask from the runtime value valid_text. Denoiser: 1 dual-stream + 2
# single-stream blocks, 2 heads x 16, RoPE axes 4 x 4 (FLUX.2's four position axes), no guidance
# embedding; it attends all max_text text rows, padding included, as the pipeline does. VAE: two
# levels (2x spatial), latent_channels 4; latents patchified 2x2 -> 16 channels, so 32x32 pixels
# are an 8 x 8 grid of 64 visual tokens.

model flux2_tiny family flux2

profile {
    height   = 32
    width    = 32
    steps    = 4
    guidance = 4.0      # CFG with the pipeline's empty negative prompt: two denoiser passes
    max_text = 32
    dtype    = float32
}

runtime valid_text: int64 in [1, max_text] default max_text
    doc "the chat-templated prompt's token count: the encoder masks the padding after it (the denoiser attends it)"
runtime seed: int64 in [0, 2**63 - 1] default 0 doc "initial-noise seed"
runtime step: int64 in [0, steps - 1] default 0 doc "index of the current denoising step"

encoder text_encoder = transformers.Qwen3ForCausalLM from "text_encoder" {
    config {
        vocab_size: 1000, hidden_size: 32, intermediate_size: 37, num_hidden_layers: 28
        num_attention_heads: 4, num_key_value_heads: 2, head_dim: 8, max_position_embeddings: 64
        tie_word_embeddings: true, bos_token_id: 1, eos_token_id: 2, pad_token_id: 0
    }
    dtype dtype
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer" max_length max_text
    input  input_ids: int64[1, max_text]
    input  valid_text: runtime valid_text
    output prompt_embeds: dtype[1, max_text, 96] select 0
}

denoiser transformer = diffusers.Flux2Transformer2DModel from "transformer" {
    config {
        patch_size: 1, in_channels: 16, num_layers: 1, num_single_layers: 2
        attention_head_dim: 16, num_attention_heads: 2, joint_attention_dim: 96
        timestep_guidance_channels: 32, mlp_ratio: 3.0, axes_dims_rope: [4, 4, 4, 4]
        rope_theta: 2000, guidance_embeds: false
    }
    dtype dtype
    input hidden_states:         dtype[1, (height / 4) * (width / 4), 16]
    input encoder_hidden_states: dtype[1, max_text, 96]
    input timestep:              dtype[1]
    input img_rope:              float32[(height / 4) * (width / 4), 2 * transformer.attention_head_dim]
    input txt_rope:              float32[max_text, 2 * transformer.attention_head_dim]  # cos | sin: host Flux2PosEmbed
    input valid_text: runtime valid_text   # always its default: the denoiser attends every text row
    output sample: dtype[1, (height / 4) * (width / 4), 16] select 0

    attention "transformer_blocks.*.attn": joint
        heads 2 head_dim 16 order (text, visual) text_mask false valid valid_text
    attention "single_transformer_blocks.*.attn": joint
        heads 2 head_dim 16 order (text, visual) text_mask false valid valid_text
}

decoder vae = diffusers.AutoencoderKLFlux2 from "vae" {
    config {
        in_channels: 3, out_channels: 3
        down_block_types: ["DownEncoderBlock2D", "DownEncoderBlock2D"]
        up_block_types: ["UpDecoderBlock2D", "UpDecoderBlock2D"]
        block_out_channels: [8, 16], layers_per_block: 1, latent_channels: 4
        norm_num_groups: 4, sample_size: 32, patch_size: [2, 2]
    }
    entry decode
    dtype dtype
    input  z: dtype[1, 16, height / 4, width / 4]     # patchified, batch-normalized: the denoiser's latents
    output sample: dtype[1, 3, height, width] select 0
}

schedule {
    flux2.encode_prompt(text_encoder)
    flux2.prepare_latents()
    flux2.denoise(transformer) {
        scheduler: diffusers.FlowMatchEulerDiscreteScheduler {
            shift: 3.0, use_dynamic_shifting: true
            base_shift: 0.5, max_shift: 1.15, base_image_seq_len: 256, max_image_seq_len: 4096
        }
        guidance: { mode: "cfg", scale: guidance }
    }
    flux2.decode(vae)
}
