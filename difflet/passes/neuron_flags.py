"""neuronx-cc compiler flags as data: the target table's `neuron_compiler` section -> arguments.

Flags change the program neuronx-cc emits (precision via auto-cast, LNC core grouping, the
model type and optimization level, tensorizer options), so for the neuron backend they are a
separate, named part of every cache key ("neuron_compiler_args", the neuron declaration's `flags`
in passes/backend_facts.py); other backends' keys do not carry it.

Invariants:
- Flags are per component role (the IR component's `role` attr: encoder, denoiser, decoder, and
  probe for the step-caching probe), as NxD Inference's text-to-image app under
  src/neuronx_distributed_inference/models/diffusers/ passes them per application (its
  transformer, clip/, t5/ and vae/ modeling_*.py `get_compiler_args`): VAE
  `--model-type=unet-inference -O1`, backbone
  `--tensorizer-options='--enable-ccop-compute-overlap'`, text encoders also
  `--cc-pipeline-tiling-factor=4`; all `--auto-cast=none`.
- `role_args` is an argv token list: `--target` and its value are two tokens, since the target
  lookup (`get_platform_target(compiler_args)`, torch_neuronx.utils, called by neuronx_distributed
  trace/functions.py and model_builder.py) splits a string on whitespace and reads the token after
  a token equal to "--target" (NxD Inference model_wrapper.py appends `--target {target}`); a
  `--target=trn2` token makes that lookup fail. `as_string` is the same tokens for ModelBuilder's
  string `compiler_args`, shell-quoted as NxD Inference writes `--tensorizer-options='...'`.
- The key part carries every role's tokens (the whole table), so the key is a function of the
  target alone (passes/cache_key.py asks `key_part(target)`).
- No torch import (passes stay torch-free).
"""
from __future__ import annotations

import shlex
from typing import Any, Mapping

from difflet.errors import DiffletError
from difflet.passes.targets import load_target

FIELDS = ("target", "lnc", "auto_cast", "roles")
ROLE_FIELDS = ("model_type", "optimization_level", "tensorizer_options")


def _section(table: Mapping[str, Any]) -> Mapping[str, Any]:
    cfg = table.get("neuron_compiler")
    if cfg is None:
        raise DiffletError(f"target {table.get('name')!r} has no neuron_compiler section", where="--target")
    missing = [k for k in FIELDS if k not in cfg]
    if missing:
        raise DiffletError(f"neuron_compiler lacks {', '.join(missing)}", where=f"target {table.get('name')}")
    return cfg


def role_args(table: Mapping[str, Any], role: str) -> list[str]:
    """neuronx-cc argv tokens for a component of `role`, in a fixed order; DiffletError naming the
    role or the missing field when the table has no complete section for it."""
    cfg = _section(table)
    roles = cfg["roles"]
    if role not in roles:
        raise DiffletError(f"neuron_compiler has no flags for component role {role!r} (roles: {', '.join(roles)})",
                           where=f"target {table.get('name')}")
    rc = roles[role]
    missing = [k for k in ROLE_FIELDS if k not in rc]
    if missing:
        raise DiffletError(f"neuron_compiler.roles.{role} lacks {', '.join(missing)}",
                           where=f"target {table.get('name')}")
    args = ["--target", str(cfg["target"]), f"--lnc={int(cfg['lnc'])}", f"--model-type={rc['model_type']}",
            f"-O{int(rc['optimization_level'])}", f"--auto-cast={cfg['auto_cast']}"]
    if rc["tensorizer_options"]:
        args.append("--tensorizer-options=" + " ".join(str(x) for x in rc["tensorizer_options"]))
    return [*args, *[str(x) for x in rc.get("extra", ())]]


def as_string(args: list[str]) -> str:
    """The tokens as one compiler_args string (ModelBuilder's form): shell-quoted, so a token with
    spaces (the tensorizer options) stays one token and `str.split()` still finds `--target trn2`."""
    return shlex.join(args)


def platform_target(table: Mapping[str, Any]) -> str:
    """The table's neuronx-cc target (the value for NEURON_PLATFORM_TARGET_OVERRIDE)."""
    return str(_section(table)["target"])


def compiler_args(table: Mapping[str, Any]) -> dict[str, list[str]]:
    """Every role's tokens (role -> `role_args`), sorted by role: the flags the key carries."""
    return {role: role_args(table, role) for role in sorted(_section(table)["roles"])}


def key_part(target: str) -> dict[str, dict[str, list[str]]]:
    """The neuron backend's cache-key part (passes/backend_facts.py): {"neuron_compiler_args": {role: [...]}}."""
    return {"neuron_compiler_args": compiler_args(load_target(target))}
