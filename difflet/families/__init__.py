"""The family registry: the one place generic code finds a model family.

A family is one folder `difflet/families/<family>/` holding everything Difflet knows about it:
- `facts.py` (torch-free): `FACTS = FamilyFacts(...)` (families/facts.py): prompt text and
  templates, default guidance, served fps, its denoisers' split rules and what codegen builds;
  read by the planner (difflet/passes) and the API process;
- `programs.py`: `CLASSES = {"<library>.<Class>": ClassDecl}` (codegen/decl.py) and optionally
  `INDEX_EXTRAS` (extra model_index.json entries of a materialized checkpoint), `index_config`
  (fn(module) -> the pipeline config such a model_index.json states) and `FP32_ROPE`
  ({"<submodule class>": fn(module) -> bool}, codegen/rope.py); read by codegen;
- `host.py`: its host steps (`@host_step("<family>.<step>", ...)`), read by the runtime;
- any private modules those import (attention processors, VAE adapters, ...).

Invariants:
- Adding a family is its folder, its descriptions (models/) and one line in `FAMILIES` below;
  no other file outside its folder names it (tests/test_structure.py holds this).
- Resolution is lazy (importlib, by name): importing the registry imports no family, and the
  torch-free facts never import a family's programs or host steps.
"""
from __future__ import annotations

import functools
import importlib
from types import ModuleType

from difflet.families.facts import NEGATIVE_PROMPT_MODES, FamilyFacts, guidance_spec, steps

# family name (the IR's `attrs.family`) -> the diffusers pipeline class its checkpoints name
FAMILIES: dict[str, str] = {
    "flux": "FluxPipeline",
    "qwen_image": "QwenImagePipeline",
    "wan": "WanPipeline",
    "hunyuan_video": "HunyuanVideoPipeline",
    "ltx2": "LTX2Pipeline",
    "flux2": "Flux2KleinPipeline",
}

NO_FACTS = FamilyFacts()  # a module of no known family: prompt as is, embedded guidance, images


def module_name(family: str, part: str) -> str:
    """The import name of one part (`facts`, `programs`, `host`) of a registered family."""
    if family not in FAMILIES:
        raise KeyError(family)
    return f"{__name__}.{family}.{part}"


@functools.cache
def facts(family: str | None) -> FamilyFacts:
    """The family's torch-free facts (NO_FACTS for a name not in the registry)."""
    if family not in FAMILIES:
        return NO_FACTS
    return importlib.import_module(module_name(family, "facts")).FACTS


def programs(family: str) -> ModuleType:
    """The family's codegen declarations module (imports torch lazily at most)."""
    return importlib.import_module(module_name(family, "programs"))


def pipeline_class(family: str | None) -> str | None:
    """The diffusers pipeline `_class_name` of the family's checkpoints."""
    return FAMILIES.get(family or "")


def all_facts() -> dict[str, FamilyFacts]:
    return {family: facts(family) for family in FAMILIES}


def facts_of(module) -> FamilyFacts:
    """The facts of an IR module's family (attrs.family)."""
    return facts(str(module.attrs.get("family", "")))


def guidance_mode(module) -> str:
    """The guidance mode the first step declaring guidance names, else the family's default."""
    default = facts_of(module).default_guidance
    for step in steps(module):
        if step.attrs.get("guidance") is not None:
            return guidance_spec(step, default)["mode"]
    return default


def uses_negative_prompt(module) -> bool:
    """Whether a set negative prompt reaches the encoders (its mode runs an unconditional pass
    on it; embedded guidance ignores it)."""
    return guidance_mode(module) in NEGATIVE_PROMPT_MODES
