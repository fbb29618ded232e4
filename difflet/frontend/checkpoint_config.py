"""Component configs read from a checkpoint at lower time (`difflet lower --weights DIR`).

Invariants:
- Only `<subfolder>/config.json` files are read: no weights, no torch.
- A config taken from the checkpoint keeps the keys the class accepts (diffusers: its __init__
  parameters; transformers: every key except saving metadata), so the IR, its cache keys and
  the parameter counts depend on the model's dimensions, not on who saved it or with which version.
- A value the description states (`config { ... }`) that the checkpoint contradicts is an error
  at that entry (file:line:col), before any weight is loaded.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from difflet.errors import DiffletError
from difflet.frontend import ast
from difflet.frontend.classes import config_keys
from difflet.frontend.shapes import Source
from difflet.ir.nodes import Attrs, freeze

# Keys transformers writes about the saving run, not about the model.
SAVE_METADATA = frozenset({"architectures", "transformers_version", "torch_dtype", "dtype", "model_type"})
_ABSENT = object()


def same_value(have: Any, want: Any) -> bool:
    """Whether a checkpoint value agrees with a stated one; a nested map agrees on the keys it states."""
    if hasattr(want, "to_python"):
        want = want.to_python()
    if isinstance(want, dict):
        have = have.to_dict() if hasattr(have, "to_dict") else have
        return isinstance(have, dict) and all(k in have and same_value(have[k], v) for k, v in want.items())
    if isinstance(have, (list, tuple)) and isinstance(want, (list, tuple)):
        return len(have) == len(want) and all(same_value(x, y) for x, y in zip(have, want))
    if isinstance(have, float) or isinstance(want, float):
        return (isinstance(have, (int, float)) and isinstance(want, (int, float))
                and abs(have - want) <= 1e-9 * max(1.0, abs(want)))
    return have == want


def resolve_checkpoint_dir(spec: str) -> Path:
    """`--weights` at lower time: a diffusers-format directory or `hf:ORG/NAME[@REV]` (offline)."""
    if spec.startswith("random:"):
        raise DiffletError("random weights take their configs from the description; at lower time "
                           "--weights needs a checkpoint directory", where="--weights")
    if spec.startswith("hf:"):
        from difflet.frontend.hub import hub_snapshot

        return hub_snapshot(spec)
    path = Path(spec)
    if not path.is_dir():
        raise DiffletError("weights directory does not exist (expected a diffusers-format checkpoint)",
                           where=str(path))
    return path


class CheckpointConfigs:
    """The config.json of each component subfolder of one checkpoint directory."""

    def __init__(self, root: Path, src: Source) -> None:
        self.root, self.src = root, src

    def _read(self, comp: ast.ComponentDecl) -> dict[str, Any]:
        path = self.root / comp.subfolder / "config.json"
        try:
            data = json.loads(path.read_text())
        except OSError:
            raise self.src.error(f"component {comp.name!r} takes its config from the checkpoint, "
                                 f"which has no {comp.subfolder}/config.json ({path})", comp.config_span) from None
        except json.JSONDecodeError as err:
            raise DiffletError(f"config.json is not valid JSON: {err}", where=str(path)) from None
        if not isinstance(data, dict):
            raise DiffletError("config.json is not a JSON object", where=str(path))
        return data

    def config(self, comp: ast.ComponentDecl, cls: type) -> Attrs:
        """The component's config as the checkpoint states it, filtered to the model's keys."""
        data = self._read(comp)
        known = config_keys(cls)
        keep = {k: v for k, v in data.items()
                if not k.startswith("_") and k not in SAVE_METADATA and (known is None or k in known)}
        return freeze(dict(sorted(keep.items())))

    def check_stated(self, comp: ast.ComponentDecl, stated: Attrs) -> None:
        """Every value the description states must be the checkpoint's (keys it omits are not checked)."""
        data = self._read(comp)
        spans = {e.key: e.span for e in comp.config.entries}
        for key, want in stated.items():
            have = data.get(key, _ABSENT)
            if have is not _ABSENT and not same_value(have, want):
                raise self.src.error(
                    f"component {comp.name!r}: the description states {key} = {_show(want)}, the "
                    f"checkpoint's {comp.subfolder}/config.json has {have!r}", spans[key])


def _show(value: Any) -> str:
    return repr(value.to_python() if hasattr(value, "to_python") else value)
