"""LTX-2 latent geometry, token packing, RoPE coordinates and the seeded start latents
(LTX2Pipeline / LTX2ImageToVideoPipeline prepare_latents and prepare_audio_latents).

Invariants:
- Shapes come from the IR (program input types): latent geometry from the VAE decoders' inputs,
  tokens from the transformer's; the profile's frames/audio are checked against the pipeline's
  own formulas and refused otherwise.
- One CPU generator per request (host/image_inputs.generator), drawn video noise first, then audio
  noise: the pipelines' order (the image-to-video encode takes the mean and draws nothing).
- An image-to-video request (`image_latents` in state, from ltx2.encode_image) starts from the
  pipeline's interpolation init * mask + noise * (1 - mask), mask 1 on latent frame 0 and 0
  elsewhere; the packed mask stays in state as `conditioning_mask` [1, video tokens].
"""
from __future__ import annotations

import torch

from difflet.errors import DiffletError
from difflet.families.ltx2.facts import FRAME_RATE
from difflet.ir.nodes import Node, Op
from difflet.runtime.host import host_step
from difflet.runtime.host.env import HostEnv, RequestState
from difflet.runtime.host.image_inputs import generator
from difflet.runtime.host.toolkit import class_config_value, input_shape, schedule_step

AUDIO_LATENT_DOWNSAMPLE = 4  # AutoencoderKLLTX2Audio's temporal and mel compression (a constant)


def first_input(component: Node) -> tuple[str, tuple[int, ...]]:
    return component.find(Op.INPUT)[0].name, tuple(component.find(Op.INPUT)[0].results[0].type.shape)


def decoders(env: HostEnv) -> list[str]:
    return list(schedule_step(env.module, "ltx2.decode").args)


def transformer_patch(env: HostEnv) -> tuple[Node, int, int]:
    """(the denoiser, its spatial patch size, its temporal patch size)."""
    transformer = env.component(schedule_step(env.module, "ltx2.denoise").args[0])
    return transformer, class_config_value(transformer, "patch_size"), class_config_value(transformer, "patch_size_t")


def geometry(env: HostEnv, frame_rate: float) -> dict:
    """Latent shapes from the IR, checked against the pipeline's frame and audio-length formulas."""
    vae, audio_vae = (env.component(n) for n in decoders(env)[:2])
    _, (_, channels, frames, height, width) = first_input(vae)
    _, (_, a_channels, a_frames, a_mel) = first_input(audio_vae)
    transformer, p, pt = transformer_patch(env)
    tokens = input_shape(transformer, "hidden_states")[1]
    if tokens != (frames // pt) * (height // p) * (width // p):
        raise DiffletError(f"transformer hidden_states has {tokens} tokens, the VAE latent "
                           f"{frames}x{height}x{width} packs to "
                           f"{(frames // pt) * (height // p) * (width // p)}", where=transformer.loc)
    profile = env.profile
    sample_rate = class_config_value(audio_vae, "sample_rate")
    hop = class_config_value(audio_vae, "mel_hop_length")
    duration = int(profile["frames"]) / frame_rate
    want_audio = round(duration * (sample_rate / hop / float(AUDIO_LATENT_DOWNSAMPLE)))
    if a_frames != want_audio:
        raise DiffletError(f"profile audio = {a_frames} latent frames, but LTX2Pipeline makes "
                           f"{want_audio} for {profile['frames']} frames at {frame_rate} fps",
                           where="profile.audio")
    mel_bins = class_config_value(audio_vae, "mel_bins")
    if a_mel != mel_bins // AUDIO_LATENT_DOWNSAMPLE:
        raise DiffletError(f"audio VAE input has {a_mel} mel bins, the config implies "
                           f"{mel_bins // AUDIO_LATENT_DOWNSAMPLE}", where=audio_vae.loc)
    return dict(video=(1, channels, frames, height, width), audio=(1, a_channels, a_frames, a_mel))


def pack_video(latents: torch.Tensor, p: int, pt: int) -> torch.Tensor:
    """[B, C, F, H, W] -> [B, F/pt * H/p * W/p, C*pt*p*p] (LTX2Pipeline._pack_latents)."""
    b, _, f, h, w = latents.shape
    latents = latents.reshape(b, -1, f // pt, pt, h // p, p, w // p, p)
    return latents.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4, 7).flatten(1, 3)


def unpack_video(latents: torch.Tensor, f: int, h: int, w: int, p: int, pt: int) -> torch.Tensor:
    """Inverse of pack_video for the latent grid (f, h, w) in patches."""
    latents = latents.reshape(latents.size(0), f, h, w, -1, pt, p, p)
    return latents.permute(0, 4, 1, 5, 2, 6, 3, 7).flatten(6, 7).flatten(4, 5).flatten(2, 3)


def rope_coords(transformer: Node, latent: tuple, audio_frames: int, fps: float):
    """(video coords [1, 3, N, 2], audio coords [1, 1, La, 2]) from the transformer's own RoPE
    helpers, configured from its config (they hold no weights)."""
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoRotaryPosEmbed

    cfg = lambda key: class_config_value(transformer, key)  # noqa: E731
    common = dict(dim=2, theta=cfg("rope_theta"), causal_offset=cfg("causal_offset"))
    video = LTX2AudioVideoRotaryPosEmbed(patch_size=cfg("patch_size"), patch_size_t=cfg("patch_size_t"),
                                         scale_factors=tuple(cfg("vae_scale_factors")), modality="video",
                                         **common)
    audio = LTX2AudioVideoRotaryPosEmbed(patch_size=cfg("audio_patch_size"),
                                         patch_size_t=cfg("audio_patch_size_t"),
                                         sampling_rate=cfg("audio_sampling_rate"),
                                         hop_length=cfg("audio_hop_length"),
                                         scale_factors=[cfg("audio_scale_factor")], modality="audio", **common)
    _, _, f, h, w = latent
    cpu = torch.device("cpu")
    return (video.prepare_video_coords(1, f, h, w, cpu, fps=fps),
            audio.prepare_audio_coords(1, audio_frames, cpu))


def conditioned_start(image_latents: torch.Tensor, noise: torch.Tensor, p: int, pt: int):
    """(start latents, packed conditioning mask [1, tokens]) of LTX2ImageToVideoPipeline.
    prepare_latents: the first frame's latents repeated over every latent frame, kept where the
    mask is 1 (latent frame 0), noise elsewhere."""
    if noise.dtype != image_latents.dtype or image_latents.shape[2] != 1:
        raise DiffletError(f"image latents {tuple(image_latents.shape)} {image_latents.dtype} are not one "
                           f"{noise.dtype} latent frame", where="ltx2.encode_image")
    b, _, f, h, w = noise.shape
    init = image_latents.repeat(1, 1, f, 1, 1)
    mask = torch.zeros((b, 1, f, h, w), dtype=noise.dtype)
    mask[:, :, 0] = 1.0
    latents = init * mask + noise * (1 - mask)
    packed_mask = pack_video(mask, p, pt)
    if packed_mask.shape[-1] != 1:  # the pipeline's squeeze(-1) needs one mask value per token
        raise DiffletError(f"image-to-video needs transformer patch_size 1 and patch_size_t 1 (has {p}, {pt})",
                           where="ltx2.prepare_latents")
    return pack_video(latents, p, pt), packed_mask.squeeze(-1)


@host_step("ltx2.prepare_latents", phase="denoise")
def prepare_latents(env: HostEnv, step: Node, state: RequestState) -> None:
    """Seeded video noise then audio noise from the request's generator, packed to tokens (from
    the image's latents on frame 0 for image-to-video), plus the RoPE coordinates (frame_rate
    from the step, default 24)."""
    from diffusers.utils.torch_utils import randn_tensor

    frame_rate = float(step.attrs.get("frame_rate", FRAME_RATE))
    geo = geometry(env, frame_rate)
    transformer, p, pt = transformer_patch(env)
    gen, cpu = generator(state), torch.device("cpu")
    video = randn_tensor(geo["video"], generator=gen, device=cpu, dtype=torch.float32)
    audio = randn_tensor(geo["audio"], generator=gen, device=cpu, dtype=torch.float32)
    image_latents = state.values.get("image_latents")
    if image_latents is None:
        state.values["video_latents"] = pack_video(video, p, pt)
    else:
        state.values["video_latents"], state.values["conditioning_mask"] = \
            conditioned_start(image_latents, video, p, pt)
    state.values["audio_latents"] = audio.transpose(1, 2).flatten(2, 3)
    state.values["coords"] = rope_coords(transformer, geo["video"], geo["audio"][2], frame_rate)
    state.values.update(geometry=geo, frame_rate=frame_rate, patch=(p, pt))
