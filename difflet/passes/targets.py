"""Target descriptions are data (difflet/passes/targets/<name>.json); no per-target code paths.

Invariant: every rule in legality.py reads its limit from a field of this table, so adding a
target is adding a JSON file. Fields:
- cores_per_device, max_cores: ranks per chip and per largest instance (trn2.48xlarge: 64);
- memory_per_core_gib, reserved_per_core_gib: HBM per rank and what the runtime keeps back;
- tile_tokens: sequence tile height (trn2: 128 SBUF partitions); max_head_dim;
- device (optional): the torch device the inductor backend compiles this target's programs for
  and runs them on (cpu, cuda); absent where the backend places its programs itself (neuron);
- backends: the codegen backends that can target it; attention_modes: CP modes it runs;
- fused_attention: the masked fused-kernel contract (equal Q/K lengths per masked call,
  contiguous valid keys, Ring built from separate calls when its kernel needs equal lengths);
- materializes_scores: whether attention scores [heads, q, k] are written to memory;
- control_flow (optional, default true): whether its compiler implements data-dependent control
  flow; false (trn2) makes codegen build a branching class as one program per branch value
  (difflet/codegen/branches.py).
- neuron_compiler (optional; neuron targets): neuronx-cc flags as data (target, lnc, model_type,
  optimization_level, auto_cast, extra); difflet/passes/neuron_flags.py turns them into arguments.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from difflet.errors import DiffletError

TABLES = Path(__file__).with_name("targets")
_REQUIRED = ("name", "cores_per_device", "max_cores", "memory_per_core_gib", "reserved_per_core_gib",
             "tile_tokens", "max_head_dim", "backends", "attention_modes", "fused_attention",
             "materializes_scores")


def target_names() -> list[str]:
    return sorted(p.stem for p in TABLES.glob("*.json"))


def load_target(name: str) -> Mapping[str, Any]:
    """The read-only table of target `name`; DiffletError for an unknown or malformed one."""
    path = TABLES / f"{name}.json"
    if not path.is_file():
        raise DiffletError(f"unknown target {name!r}; known: {', '.join(target_names())}",
                           where="--target", snippet=name)
    table = json.loads(path.read_text())
    missing = [k for k in _REQUIRED if k not in table]
    if missing:
        raise DiffletError(f"target table lacks {', '.join(missing)}", where=str(path))
    return MappingProxyType(table)


def program_device(name: str | None) -> str | None:
    """The torch device programs for target `name` are compiled for (its table's `device`; None
    when the table has none, or for no target)."""
    return load_target(name).get("device") if name else None
