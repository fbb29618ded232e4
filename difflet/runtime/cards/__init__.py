"""Family cards: what the torch-free API process knows about each model family.

A card module `difflet.runtime.cards.<family>` (torch-free: the API process imports it)
declares `CARD = FamilyCard(...)`; the family's host schedule (runtime/host/<family>.py) takes
the same facts from it, so what admission counts and the HTTP model card says cannot drift
from what is served.

Invariants:
- Generic API-process code reaches a family only through `card_of(module)`, by name
  (importlib); a module without a family card gets `FamilyCard()` (prompt as is, no template,
  embedded guidance, images).
- The guidance mode is the one a step of the module declares (`guidance: {mode: ...}`), else the
  card's `default_guidance`, which the host steps also fall back to.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable

NEGATIVE_PROMPT_MODES = ("cfg", "true_cfg")  # the modes whose unconditional pass encodes the negative prompt


def _as_is(prompt: str, templated: bool) -> str:
    return prompt


def _none(module) -> frozenset[str]:
    return frozenset()


def _no_video(module) -> float:
    return 0.0


@dataclass(frozen=True)
class FamilyCard:
    # the string a host step hands the tokenizer; `templated`: the encoder reads the prompt
    # inside the pipeline's template (see `templated`)
    prompt_text: Callable[[str, bool], str] = _as_is
    templated: Callable[[Any], frozenset[str]] = _none  # module -> encoder names
    default_guidance: str = "embedded"  # the mode when no step declares one
    fps: Callable[[Any], float] = _no_video  # module -> frame rate of the served video (0: images)


def card_of(module) -> FamilyCard:
    """The card of the module's family (attrs.family)."""
    family = str(module.attrs.get("family", ""))
    name = f"{__name__}.{family}"
    if not family.isidentifier() or importlib.util.find_spec(name) is None:
        return FamilyCard()
    return importlib.import_module(name).CARD


def steps(module):
    """Every host step of the module's schedules, in order."""
    from difflet.ir.nodes import Op

    for sched in module.find(Op.SCHEDULE):
        yield from sched.body


def find_step(module, name: str):
    """The first host step called `name` (e.g. "wan.decode"), or None."""
    return next((s for s in steps(module) if str(s.name) == name), None)


def step_attr(module, name: str, key: str, default):
    """Attribute `key` of step `name`, or `default` when the step or the attribute is absent."""
    step = find_step(module, name)
    value = step.attrs.get(key) if step is not None else None
    return default if value is None else value


def guidance_mode(module) -> str:
    """The guidance mode a step declares, else the family's default."""
    for step in steps(module):
        spec = step.attrs.get("guidance")
        if spec is not None:
            spec = spec.to_python() if hasattr(spec, "to_python") else spec
            if isinstance(spec, dict) and "mode" in spec:
                return str(spec["mode"])
    return card_of(module).default_guidance


def uses_negative_prompt(module) -> bool:
    """Whether a set negative prompt reaches the encoders (its mode runs an unconditional pass
    on it; FLUX's embedded guidance ignores it)."""
    return guidance_mode(module) in NEGATIVE_PROMPT_MODES
