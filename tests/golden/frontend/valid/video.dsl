# A video model shaped like Wan 2.1 (3-D latents, self + cross attention, true CFG) with every
# config read from the checkpoint: the grammar is not FLUX-specific.
model video_mini family wan

profile {
    height   = 480
    width    = 832
    frames   = 81
    steps    = 50
    guidance = 5.0
    max_text = 512
    dtype    = bfloat16
}

runtime seed: int64 in [0, 2**63 - 1] default 0
runtime step: int64 in [0, steps - 1] default 0

encoder text_encoder = transformers.UMT5EncoderModel from "text_encoder" {
    config from checkpoint
    tokenizer transformers.PreTrainedTokenizerFast from "tokenizer" max_length max_text
    input  input_ids: int64[1, max_text]
    output prompt_embeds: dtype[1, max_text, 4096] select "last_hidden_state"
}

denoiser transformer = diffusers.WanTransformer3DModel from "transformer" {
    config from checkpoint
    input hidden_states: dtype[1, 16, (frames - 1) / 4 + 1, height / 8, width / 8]
    input timestep: int64[1]
    input encoder_hidden_states: dtype[1, max_text, 4096]
    output sample: dtype[1, 16, (frames - 1) / 4 + 1, height / 8, width / 8] select 0
    attention "blocks.*.attn1": self heads 40 head_dim 128
    attention "blocks.*.attn2": cross heads 40 head_dim 128 text_mask false
}

decoder vae = diffusers.AutoencoderKLWan from "vae" {
    config from checkpoint
    entry decode
    input z: dtype[1, 16, (frames - 1) / 4 + 1, height / 8, width / 8]
    output sample: dtype[1, 3, frames, height, width] select "sample"
}

schedule {
    wan.encode_prompt(text_encoder)
    wan.prepare_latents()
    wan.denoise(transformer) {
        scheduler: diffusers.UniPCMultistepScheduler {
            prediction_type: "flow_prediction", use_flow_sigmas: true, flow_shift: 3.0
            solver_order: 2, solver_type: "bh2", num_train_timesteps: 1000
        }
        guidance: { mode: "true_cfg", scale: guidance }
    }
    wan.decode(vae)
}
