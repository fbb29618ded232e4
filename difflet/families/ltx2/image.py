"""LTX-2 image-to-video's first frame (LTX2ImageToVideoPipeline.__call__ and prepare_latents).

Invariants:
- The image is what the pipeline encodes for the same file: the image as given (the profile's
  `image_original`), H.264 re-compressed at the image CRF (the step's `image_crf`, default the
  pipeline's resolve_default_image_crf of the text encoder class: 33 for Gemma 3; 0 skips it),
  then resized to the request's size by the pipeline's own VideoProcessor, whose resample is
  bilinear (so not the API process's lanczos-resized `image`, used only without the original).
- The VAE encoder program takes the mean (no random draw) and normalizes it with the VAE's
  buffers (programs.VideoEncodeProgram); the float32 [1, C, 1, h, w] result is `image_latents`,
  which ltx2.prepare_latents turns into the conditioned start.
"""
from __future__ import annotations

import numpy as np

from difflet.errors import DiffletError
from difflet.families.ltx2.latents import first_input
from difflet.ir.nodes import Node
from difflet.runtime.host import host_step
from difflet.runtime.host.env import HostEnv, RequestState
from difflet.runtime.host.toolkit import schedule_step
from difflet.runtime.images import to_pil


def image_crf(env: HostEnv, step: Node) -> int:
    """The step's `image_crf`, else the pipeline's default for the text encoder's model type."""
    if "image_crf" in step.attrs:
        crf = step.attrs["image_crf"]
        if not isinstance(crf, int) or isinstance(crf, bool) or not 0 <= crf <= 51:
            raise DiffletError(f"image_crf = {crf!r}: an H.264 CRF is an integer in [0, 51] (0: none)",
                               where=step.loc)
        return crf
    from types import SimpleNamespace

    from diffusers.pipelines.ltx2.utils import resolve_default_image_crf

    from difflet.frontend.classes import resolve_class

    encoder = env.component(schedule_step(env.module, "ltx2.encode_prompt").args[0])
    model_type = getattr(resolve_class(encoder.attrs["class"]).config_class, "model_type", None)
    return resolve_default_image_crf(SimpleNamespace(config=SimpleNamespace(model_type=model_type)))


def conditioning_image(state: RequestState, crf: int):
    """The PIL image the pipeline preprocesses: the request's image re-compressed at `crf`."""
    from PIL import Image

    from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf

    params = state.params
    # the pipeline re-compresses and resizes the file as given (profile image_original)
    original = to_pil(params.image_original[0] if params.image_original else params.image[0])
    return Image.fromarray(apply_image_conditioning_crf(np.array(original.convert("RGB")), crf)) if crf else original


@host_step("ltx2.encode_image", phase="encode")
def encode_image(env: HostEnv, step: Node, state: RequestState) -> None:
    """The request's image -> the VAE encoder program -> normalized first-frame `image_latents`."""
    from diffusers.video_processor import VideoProcessor

    (vae_name,) = step.args
    vae, params = env.component(vae_name), state.params
    name, (_, _, frames, height, width) = first_input(vae)
    if frames != 1 or (height, width) != (params.height, params.width):
        raise DiffletError(f"the VAE encoder takes [1, 3, {frames}, {height}, {width}]; image-to-video "
                           f"encodes one {params.width}x{params.height} frame", where=vae.loc)
    latent_height = first_input(env.component(schedule_step(env.module, "ltx2.decode").args[0]))[1][3]
    processor = VideoProcessor(vae_scale_factor=params.height // latent_height, resample="bilinear")  # the pipeline's
    image = processor.preprocess(conditioning_image(state, image_crf(env, step)), height=params.height,
                                 width=params.width)
    dtype = state.values["cond"][0].dtype  # the pipeline casts the image to prompt_embeds'
    out = env.invoke(vae_name, **{name: image.to(dtype).unsqueeze(2)})
    state.values["image_latents"] = next(iter(out.values()))
