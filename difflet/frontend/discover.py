"""The description that serves a checkpoint, found from the checkpoint itself when no model is
named: model_index.json's `_class_name` -> the registered family whose pipeline class it is ->
that family's choice of bundled description (`FamilyFacts.description`), or the description a
family names for another pipeline class of its checkpoints (`FamilyFacts.pipelines`).

Invariants:
- Torch-free: reads JSON files only (the API process and `difflet lower` use it).
- Every failure is a DiffletError naming the file (or the argument) and what to do; an
  unsupported pipeline class lists the supported ones.
"""
from __future__ import annotations

import json
from pathlib import Path

from difflet.bundled import MODELS_DIR
from difflet.errors import DiffletError
from difflet.families import FAMILIES, facts


def checkpoint_dir(weights: str, where: str) -> Path:
    """A diffusers-format directory from `weights` (a path or hf:ORG/NAME); random:SEED has no
    checkpoint to read a family from."""
    if weights.startswith("random:"):
        raise DiffletError(f"{weights} has no model_index.json to find the family from: name the "
                           "model (a bundled description or a .dsl path)", where=where)
    if weights.startswith("hf:"):
        from difflet.frontend.hub import hub_snapshot

        return hub_snapshot(weights)
    return Path(weights)


def description_for(weights: str, where: str = "model") -> Path:
    """models/NAME.dsl serving the checkpoint `weights` (its family from model_index.json)."""
    root = checkpoint_dir(weights, where)
    index = root / "model_index.json"
    try:
        class_name = json.loads(index.read_text()).get("_class_name")
    except FileNotFoundError:
        raise DiffletError("no model_index.json: not a diffusers-format checkpoint directory; name "
                           "the model to serve it with", where=str(index)) from None
    except (OSError, ValueError, AttributeError) as err:
        raise DiffletError(f"cannot read the pipeline class: {err}", where=str(index)) from None
    name = _description(class_name, root, index)
    path = MODELS_DIR / f"{name}.dsl"
    if not name or not path.is_file():
        raise DiffletError(f"no bundled description serves a {class_name} checkpoint",
                           where=str(index))
    return path


def _description(class_name, root: Path, index: Path) -> str:
    """The bundled description's name for a checkpoint whose model_index.json names `class_name`."""
    for family, main in FAMILIES.items():
        if class_name == main:
            try:
                return facts(family).description(root)
            except (OSError, ValueError) as err:  # a family reading a component's config.json
                raise DiffletError(f"cannot choose the {family} description: {err}", where=str(root)) from None
        if class_name in facts(family).pipelines:
            chosen = facts(family).pipelines[class_name]
            return chosen(root) if callable(chosen) else chosen
    supported = ", ".join([*FAMILIES.values(), *(c for f in FAMILIES for c in facts(f).pipelines)])
    raise DiffletError(f"_class_name {class_name!r} is not a pipeline Difflet serves (supported: "
                       f"{supported})", where=str(index))
