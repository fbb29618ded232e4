"""`DiffletPipeline`: the diffusers-shaped Python API over lower -> opt -> codegen -> ModelRunner.

    pipe = DiffletPipeline.from_pretrained("ckpt/", model="qwen-image", height=768, width=1344)
    image = pipe("a red fox in the snow", num_inference_steps=28, seed=0).images[0]

Invariants:
- Compile-time shapes (height, width, num_frames, max_sequence_length, dtype) and the parallel
  layout are `from_pretrained` arguments; a call asking for another size is refused, naming the
  argument and the compiled size. Steps, guidance, seed and prompts are per call: the call's
  keyword arguments are request.Request's fields by their diffusers names (derived, not listed).
- Configs come from the checkpoint (`config from checkpoint` components) and programs from the
  program store: a second `from_pretrained` of the same model, shapes and weights compiles
  nothing and rewrites nothing (the artifact directory is keyed by the planned programs and
  the weight files' sizes and times).
- The model runs in this process (ModelRunner); `close()` (or `with`) stops split rank workers.
- `num_images_per_prompt=n` generates with seeds seed, seed+1, ..., seed+n-1 (one request each),
  so image i equals a single call with seed+i; diffusers instead draws one batched noise tensor.
"""
from __future__ import annotations

import hashlib
import json
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from difflet.bundled import MODELS_DIR
from difflet.errors import DiffletError
from difflet.runtime.request import from_arguments, names, with_arguments

_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}


@dataclass
class DiffletPipelineOutput:
    """`.images` (PIL, or float arrays in [0, 1] with output_type="np") for image models,
    `.frames` (one list of PIL frames, or one [F, H, W, 3] array, per video) for video models;
    `.seeds` and the raw `.results` (PNG/MP4 bytes, timings, step-cache stats) for each output."""

    images: list = field(default_factory=list)
    frames: list = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    results: list = field(default_factory=list)


def model_description(model: str | Path) -> Path:
    """A model name (`qwen-image`, `wan2.1-tiny`: models/NAME.dsl) or a path to a .dsl file."""
    path = Path(model)
    if path.suffix == ".dsl" or path.is_file():
        if not path.is_file():
            raise DiffletError("model description does not exist", where=str(path))
        return path
    named = MODELS_DIR / f"{model}.dsl"
    if not named.is_file():
        known = ", ".join(sorted(p.stem for p in MODELS_DIR.glob("*.dsl")))
        raise DiffletError(f"unknown model {str(model)!r} (one of {known}, or a .dsl path)", where="model")
    return named


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    return _DTYPE_NAMES.get(name, name)


def _weights_fingerprint(weights: str) -> str:
    """Sizes and modification times of the checkpoint's files (cheap; a changed file changes it)."""
    root = Path(weights)
    if not root.is_dir():
        return weights  # random:SEED and hf:ORG/NAME name their contents
    stats = sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns)
                   for p in root.rglob("*") if p.is_file())
    return hashlib.sha256(json.dumps([str(root.resolve()), stats]).encode()).hexdigest()


class DiffletPipeline:
    """One compiled model, loaded in this process; call it like a diffusers pipeline."""

    def __init__(self, runner, art: Path | None = None) -> None:
        self.runner, self.art = runner, art
        self._lora = ""  # the calls' adapter when they name none (load_lora_weights, set_adapters)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, *, model: str | Path | None = None,
                        height: int | None = None, width: int | None = None,
                        num_frames: int | None = None, max_sequence_length: int | None = None,
                        dtype: Any = None, shapes: list[str] | None = None,
                        batch_sizes: list[int] | None = None, parallel: str = "tp1", attention: str | None = None,
                        backend: str = "inductor", target: str = "cpu", profile: dict | None = None,
                        store: str | Path | None = None, cache: str = "off", verbose: bool = False,
                        log: Callable[[str], Any] | None = None,
                        **component_files: str | Path) -> "DiffletPipeline":
        """Lower MODEL for these shapes with configs from the checkpoint, plan, compile (or reuse
        from the store) and load; `shapes` ("WxH" / "WxHxF", the first the default) serves several
        sizes from one load; `batch_sizes` (e.g. [1, 2, 4]) compiles the denoiser at those batch
        sizes, so `num_images_per_prompt` images and several prompts run as batched calls.
        `pretrained_model_name_or_path`: a diffusers-format directory,
        `hf:ORG/NAME` (local cache, offline) or `random:SEED` (configs from the description).
        `model`: a bundled description name or a .dsl path; None: the family's description, found
        from the checkpoint's model_index.json (as diffusers' DiffusionPipeline does).
        `NAME=PATH` (e.g. `transformer="flux1-dev.safetensors"`): that component's weights from a
        single file in its original layout, converted once into the store by diffusers'
        `from_single_file` (config from the checkpoint's NAME/config.json); `log` (default print)
        gets one line while converting."""
        from difflet.codegen.driver import codegen
        from difflet.codegen.manifest import MANIFEST
        from difflet.codegen.store import default_store_dir
        from difflet.frontend.discover import description_for
        from difflet.frontend.lower import lower_file
        from difflet.passes.pipeline import optimize

        weights = str(pretrained_model_name_or_path)
        overrides = {k: str(v) for k, v in (profile or {}).items()}
        for key, value in (("height", height), ("width", width), ("frames", num_frames),
                           ("max_text", max_sequence_length)):
            if value is not None:
                overrides[key] = str(int(value))
        if dtype is not None:
            overrides["dtype"] = _dtype_name(dtype)
        dsl = description_for(weights) if model is None else model_description(model)
        module = lower_file(dsl, overrides, None if weights.startswith("random:") else weights, shapes,
                            batch_sizes)
        store_root = Path(store) if store is not None else default_store_dir()
        if component_files:  # the weights become a store directory with the converted components
            from difflet.codegen.single_file import with_component_files

            weights = str(with_component_files(module, weights, component_files, store_root,
                                                   log=log or print, verbose=verbose))
        module = optimize(module, parallel=parallel, target=target, backend=backend, attention=attention)
        keys = [[c.name, c.attrs["cache_key"]] for c in module.components()]
        art_key = hashlib.sha256(json.dumps([keys, backend, _weights_fingerprint(weights)]).encode()).hexdigest()
        art = store_root / "pipelines" / art_key[:32]
        if not (art / MANIFEST).is_file():  # the manifest is written last: present = complete
            codegen(module, weights, art, backend=backend, store=store_root,
                    log=log or (print if verbose else (lambda *a: None)), verbose=verbose)
        return cls.from_artifacts(art, cache=cache)

    @classmethod
    def from_artifacts(cls, art: str | Path, cache: str = "off") -> "DiffletPipeline":
        """Load a compiled ART directory (`difflet codegen -o ART`); its images of one call run
        together up to the largest compiled batch size."""
        from difflet.codegen.manifest import read_manifest
        from difflet.runtime.runner import ModelRunner

        max_batch = max(read_manifest(art).batch_sizes)
        return cls(ModelRunner.from_artifacts(art, cache=cache, max_batch=max_batch), Path(art))

    @property
    def profile(self) -> dict[str, Any]:
        """The compiled serving profile (height, width, steps, guidance, max_text, dtype, ...)."""
        return self.runner.profile

    @with_arguments
    def __call__(self, prompt: str | list[str], negative_prompt: str | None = None, *,
                 image: Any = None, mask_image: Any = None, last_image: Any = None,
                 generator: Any = None, seed: int | None = None, num_images_per_prompt: int = 1,
                 output_type: str = "pil", callback: Callable[[int, int, bool], Any] | None = None,
                 **arguments: Any) -> DiffletPipelineOutput:
        """Generate for each prompt and image; `generator` (a torch.Generator) gives its seed.
        `callback(step, total_steps, cached)` runs after every denoising step. `image` (a PIL
        image, an image file's bytes, or a list of them), `mask_image` and `last_image` (a
        first-last-frame model's last frame, as WanImageToVideoPipeline takes it) are an
        image-input model's inputs, resized as the reference pipeline does. `arguments` are the request's
        other fields by their diffusers names (num_inference_steps, guidance_scale, strength,
        height, width, num_frames, cache, ...; None = the profile's)."""
        fields = from_arguments(arguments, "__call__")
        if last_image is not None:  # the request's second image
            if image is None or isinstance(image, (list, tuple)):
                raise DiffletError("last_image: give the first frame as one `image` beside it", where="last_image")
            image = [image, last_image]
        fields.update(image=image, mask_image=mask_image)
        if fields.get("lora") is None and self._lora:
            fields["lora"] = self._lora  # set_adapters / load_lora_weights
        if output_type not in ("pil", "np"):
            raise DiffletError(f"output_type: {output_type!r} is not 'pil' or 'np'", where="output_type")
        if int(num_images_per_prompt) < 1:
            raise DiffletError("num_images_per_prompt: must be >= 1", where="num_images_per_prompt")
        base = seed if seed is not None else generator.initial_seed() if generator is not None \
            else secrets.randbelow(2**63 - num_images_per_prompt)
        out = DiffletPipelineOutput()
        requests = [self._params(**fields, prompt=text, negative_prompt=negative_prompt, seed=base + i)
                    for text in ([prompt] if isinstance(prompt, str) else list(prompt))
                    for i in range(int(num_images_per_prompt))]
        with ThreadPoolExecutor(self.runner.max_batch) as pool:  # up to max_batch run as one batch
            results = list(pool.map(lambda p: self.runner.generate(p, on_step=callback), requests))
        for params, result in zip(requests, results):
            out.seeds.append(params.seed)
            out.results.append(result)
            if result.video is None:
                out.images.append(_image(result.image, output_type))
            else:
                out.frames.append(_video(result.video, output_type))
        return out

    def load_lora_weights(self, path: str | Path, adapter_name: str | None = None, scale: float = 1.0) -> str:
        """Load a LoRA adapter (any file diffusers' `load_lora_weights` reads) under `adapter_name`
        (default: the file's stem) and make it the calls' adapter at `scale`; merged into the same
        compiled programs, so nothing compiles. Returns the name (a call's `lora="NAME:SCALE"`
        picks among the loaded ones)."""
        import re

        name = adapter_name or re.sub(r"[^A-Za-z0-9_.-]", "_", Path(path).stem)[:64] or "adapter"
        self.runner.load_loras([(name, str(path), float(scale))])
        self.set_adapters(name, scale)
        return name

    def set_adapters(self, adapter_names: str | list[str], adapter_weights: float | list[float] | None = None) -> None:
        """The adapter (and its scale) calls use when they do not name one; one adapter at a time
        ([] = the base weights). diffusers' weighted mix of several adapters is not served."""
        names_ = [adapter_names] if isinstance(adapter_names, str) else list(adapter_names)
        weights = adapter_weights if isinstance(adapter_weights, (list, tuple)) else [adapter_weights] * len(names_)
        if len(names_) > 1:
            raise DiffletError(f"adapter_names: {names_} - one adapter per call is served (a mix of several "
                               "is not)", where="adapter_names")
        if not names_:
            self._lora = ""
            return
        scale = self.runner.adapters.get(names_[0]) if weights[0] is None else weights[0]
        lora = f"{names_[0]}:{scale}" if scale is not None else names_[0]
        self._params(prompt="adapter check", lora=lora)  # an unknown name or scale fails here, named
        self._lora = lora

    def disable_lora(self) -> None:
        """Calls use the base weights (the loaded adapters stay loaded)."""
        self._lora = ""

    def _params(self, **fields: Any):
        try:
            return self.runner.resolve(**fields)
        except DiffletError as err:
            name = names("api").get(str(err.where), err.where)
            message = err.message.replace(f"{err.where}:", f"{name}:", 1)
            if str(err.where) in ("height", "width", "frames"):
                message += " (from_pretrained(height=, width=, num_frames=) or shapes= compiles others)"
            raise DiffletError(message, where=name) from None

    def close(self) -> None:
        self.runner.close()

    def __enter__(self) -> "DiffletPipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _image(array, output_type: str):
    if output_type == "np":
        return array.astype("float32") / 255.0
    from PIL import Image

    return Image.fromarray(array)


def _video(array, output_type: str):
    if output_type == "np":
        return array.astype("float32") / 255.0
    from PIL import Image

    return [Image.fromarray(frame) for frame in array]
