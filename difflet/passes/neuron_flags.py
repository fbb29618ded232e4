"""neuronx-cc compiler flags as data: the target table's `neuron_compiler` section -> arguments.

Flags change the program neuronx-cc emits (precision via auto-cast, LNC core grouping, the
optimization level), so for the neuron backend they are a separate, named part of every cache
key ("neuron_compiler_args", the neuron declaration's `flags` in passes/backend_facts.py); other
backends' keys do not carry it. Flag spellings follow the
Neuron Compiler CLI reference (neuronx-cc, Neuron SDK 2.29) and NxD ModelBuilder's defaults
(`--enable-saturate-infinity --auto-cast=none --model-type=transformer -O1`, `--lnc=2` on trn2).
Invariant: no torch import (passes stay torch-free).
"""
from __future__ import annotations

from typing import Any, Mapping

from difflet.errors import DiffletError
from difflet.passes.targets import load_target

FIELDS = ("target", "lnc", "model_type", "optimization_level", "auto_cast")


def compiler_args(table: Mapping[str, Any]) -> list[str]:
    """neuronx-cc arguments of a target table, in a fixed order; DiffletError if the section is incomplete."""
    cfg = table.get("neuron_compiler")
    if cfg is None:
        raise DiffletError(f"target {table.get('name')!r} has no neuron_compiler section", where="--target")
    missing = [k for k in FIELDS if k not in cfg]
    if missing:
        raise DiffletError(f"neuron_compiler lacks {', '.join(missing)}", where=f"target {table.get('name')}")
    return [f"--target={cfg['target']}", f"--lnc={int(cfg['lnc'])}", f"--model-type={cfg['model_type']}",
            f"-O{int(cfg['optimization_level'])}", f"--auto-cast={cfg['auto_cast']}",
            *[str(x) for x in cfg.get("extra", ())]]


def key_part(target: str) -> dict[str, list[str]]:
    """The neuron backend's cache-key part (passes/backend_facts.py): {"neuron_compiler_args": [...]}."""
    return {"neuron_compiler_args": compiler_args(load_target(target))}
