"""What a model family declares torch-free, for the planner and the API process, and the IR
step queries every family's facts and host steps share.

A family's `difflet.families.<family>.facts` declares `FACTS = FamilyFacts(...)`; its host
steps (`host.py`) take the same constants from it, so what admission counts, what the HTTP
model card says and what the planner calls buildable cannot drift from what is served and built.

Invariants:
- Torch-free (the API process and difflet/passes import it).
- `rules` holds the family's own denoiser classes' split rules (passes/split_rules.py reads them
  through the registry); `split_built` / `probe_built` / `spmd_built` / `blocks_built` name those of its classes
  whose split / probe / neuron SPMD programs codegen builds (passes/built.py), and exactly those
  have a `SplitDecl` / `ProbeDecl` in the family's programs.py (tests/test_passes_built.py).
- The guidance mode is the one a step of the module declares (`guidance: {mode: ...}`), else
  `default_guidance`; host steps read it through `guidance_spec`, the one parser.
- `derived_config` adds, at lower time, keys a description's expressions may read
  (`vae.cache0_channels`) that no config.json states but the class's structure fixes; they never
  enter the IR (its `config` attr stays what the checkpoint or the description says) and never
  shadow a key the config has (other than as null).
- `derived_profile` replaces, at lower time, profile values that follow from others as the family's
  pipeline computes them (so `from_pretrained(num_frames=9)` needs no second, matching number); a
  value the caller overrides is kept as given (and checked by the host steps).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

NEGATIVE_PROMPT_MODES = ("cfg", "true_cfg")  # the modes whose unconditional pass encodes the negative prompt


def _as_is(prompt: str, templated: bool) -> str:
    return prompt


def _none(module) -> frozenset[str]:
    return frozenset()


def _no_video(module) -> float:
    return 0.0


@dataclass(frozen=True)
class FamilyFacts:
    # the string a host step hands the tokenizer; `templated`: the encoder reads the prompt
    # inside the pipeline's template (see `templated`)
    prompt_text: Callable[[str, bool], str] = _as_is
    templated: Callable[[Any], frozenset[str]] = _none  # module -> encoder names
    default_guidance: str = "embedded"  # the mode when no step declares one
    fps: Callable[[Any], float] = _no_video  # module -> frame rate of the served video (0: images)
    rules: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # class -> split rules
    split_built: tuple[str, ...] = ()
    probe_built: tuple[str, ...] = ()
    spmd_built: tuple[str, ...] = ()
    blocks_built: tuple[str, ...] = ()  # denoisers codegen cuts into block mode's front and rest
    # checkpoint directory -> the bundled description (models/NAME.dsl) that serves it, when
    # no model is named (the family is found from model_index.json: difflet/frontend/discover.py)
    description: Callable[[Any], str] = lambda ckpt: ""
    # another pipeline class a checkpoint of the family may name (FLUX.1-Kontext-dev's
    # FluxKontextPipeline) -> the bundled description that serves it, or a function of the
    # checkpoint directory choosing it (Wan's image-to-video: 2.1 or 2.2 A14B)
    pipelines: Mapping[str, str | Callable[[Any], str]] = field(default_factory=dict)
    # class -> (its resolved config -> derived keys), read by the frontend's expressions only
    derived_config: Mapping[str, Callable[[Mapping[str, Any]], Mapping[str, Any]]] = field(default_factory=dict)
    # (profile, class -> resolved config) -> profile values the family's pipeline computes from
    # others (LTX-2's audio latent frames from the frame count); applied unless given as overrides
    derived_profile: Callable[[Mapping[str, Any], Mapping[str, Mapping[str, Any]]], Mapping[str, Any]] = \
        lambda profile, configs: {}
    # (width, height) sizes an input image snaps to by aspect ratio, in a profile that compiles
    # the image at its own size (`image_width`/`image_height`) with `image_auto_resize = true`
    input_sizes: tuple[tuple[int, int], ...] = ()
    # class -> the keys its components' `options {...}` may state (read by the family's program
    # wrapper and host steps; the frontend refuses any other key)
    options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # module -> (label, whether its pass runs) per guidance term beyond CFG's passes (LTX-2's STG
    # and modality isolation), for the documents' guidance column
    extra_guidance: Callable[[Any], tuple[tuple[str, bool], ...]] = lambda module: ()


def steps(module):
    """Every host step of the module's schedules, in order."""
    from difflet.ir.nodes import Op

    for sched in module.find(Op.SCHEDULE):
        yield from sched.body


def find_step(module, name: str):
    """The first host step called `name` (`<family>.<step>`), or None."""
    return next((s for s in steps(module) if str(s.name) == name), None)


def step_attr(module, name: str, key: str, default):
    """Attribute `key` of step `name`, or `default` when the step or the attribute is absent."""
    step = find_step(module, name)
    value = step.attrs.get(key) if step is not None else None
    return default if value is None else value


def guidance_spec(step, default_mode: str) -> dict:
    """A step's `guidance` attrs as a dict with `mode` always set (the default mode when the
    step names none): the one reading every host step and the API process share."""
    spec = step.attrs.get("guidance") if step is not None else None
    spec = spec.to_python() if hasattr(spec, "to_python") else dict(spec or {})
    if not isinstance(spec, dict):
        spec = {}
    spec.setdefault("mode", default_mode)
    spec["mode"] = str(spec["mode"])
    return spec
