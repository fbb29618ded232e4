"""The `neuron` backend (Trainium2): torch-neuronx, imported lazily. Targets Neuron SDK 2.29.

Written against the documented APIs (awsdocs-neuron v2.29.1: "PyTorch NeuronX Tracing API for
Inference" = torch_neuronx.trace, "Weight Replacement API" = torch_neuronx.replace_weights) and
untested here: this machine has no Neuron SDK (PyPI carries only placeholder wheels), so
`require_sdk()` raises BackendUnavailable with what to install. Nothing is faked: without the
SDK no program is produced. What is checked on CPU: tests/test_neuron_backend.py (flags, weights
split, aliased probe state) and `difflet check --target trn2` (graph rules).

Invariants:
- Weights are never inlined: `trace(..., inline_weights_to_neff=False)`, and the stored program's
  weights are zeroed with `replace_weights` before saving, so a store entry holds no checkpoint's
  values and its identity stays its cache key (which excludes weights). The runner loads the ART's
  `weights/<name>.rank0.safetensors` (the module's state dict) with `replace_weights`.
- Compiler flags come from the target table per component role (passes/neuron_flags.py) as argv
  tokens (`--target trn2`: two tokens) and are part of the key; NEURON_PLATFORM_TARGET_OVERRIDE
  is set from the table unless the user set it (as NxD Inference's diffusers app does).
- neuronx-cc's work directory is inside the entry being produced (removed after a successful
  compile) and NEURON_COMPILE_CACHE_URL points under Difflet's store, unless the user set it.
- Persistent state (the step-caching probe's previous feature) is an aliased output:
  `input_output_aliases={buffer: output_index}` with the new value returned out of place
  (neuron_state.py), never an in-place `copy_`.
- Runtime values are traced and fed as shape-[1] tensors (neuron_inputs.py: a 0-d example input
  of 0/1, or equal to a scalar of the graph, would not become a program input of its own under
  torch_neuronx.trace's `.to(xla_device)`); their positions are in the program's neuron.json.
- Tensor-parallel components never come here: codegen's driver sends them to neuron_spmd.py
  (one SPMD program for all ranks through NxD ModelBuilder, Difflet-presharded rank weights);
  neuron_load.SpmdProgram loads that program (split_codegen.split_program).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

from difflet.errors import BackendUnavailable

PROGRAM_FILE = "program.pt"
META_FILE = "neuron.json"
SDK_RELEASE = "2.29"
INSTALL_HINT = ("install the AWS Neuron SDK (release 2.29) on a Trainium (trn2) host: "
                "`pip install torch-neuronx neuronx-cc neuronx-distributed "
                "--extra-index-url https://pip.repos.neuron.amazonaws.com` "
                "(see https://awsdocs-neuron.readthedocs-hosted.com/ for the setup guide)")


def require_sdk() -> None:
    """Raise BackendUnavailable unless torch_neuronx and neuronx_distributed are importable."""
    missing = [m for m in ("torch_neuronx", "neuronx_distributed") if importlib.util.find_spec(m) is None]
    if missing:
        raise BackendUnavailable(f"backend 'neuron' needs the Neuron SDK ({', '.join(missing)} not installed); "
                                 + INSTALL_HINT, where="--backend")


def compiler_args(role: str, target: str = "trn2") -> list[str]:
    """neuronx-cc argv tokens for a component of `role` (passes/neuron_flags.py `role_args`)."""
    from difflet.passes.neuron_flags import role_args
    from difflet.passes.targets import load_target

    return role_args(load_target(target), role)


def set_platform_target(target: str = "trn2") -> None:
    """NEURON_PLATFORM_TARGET_OVERRIDE from the target table unless the user set it."""
    from difflet.passes.neuron_flags import platform_target
    from difflet.passes.targets import load_target

    # as NxD Inference's models/diffusers/ transformer module (top level): set only when not already set
    if not os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE"):
        os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] = platform_target(load_target(target))


def compile_cache_dir(dest: Path) -> Path:
    """<store>/neuron-compile-cache for an entry produced at <store>/neuron/<xx>/.<key>.tmp/entry."""
    parents = dest.resolve().parents
    root = parents[3] if len(parents) > 3 and parents[2].name == "neuron" else dest.parent
    return root / "neuron-compile-cache"


def program_weights(pm, entry: Path) -> dict:
    """The program's weights: `pm`'s state dict (what replace_weights takes), tied names cloned."""
    out, seen = {}, set()
    for k, t in pm.state_dict().items():
        t = t.detach()
        ptr = t.untyped_storage().data_ptr() if t.numel() else -1
        out[k] = t.contiguous().clone() if ptr in seen else t.contiguous()  # safetensors refuses shared storage
        seen.add(ptr)
    return out


def compile_entry(node, pm, dest: Path) -> None:
    """Trace `pm` for one NeuronCore group (tp1) into `dest` (see module invariants)."""
    import torch
    import torch_neuronx

    from difflet.codegen.neuron_inputs import runtime_positions, trace_inputs, vector_runtime_inputs
    from difflet.codegen.neuron_state import aliased_program
    from difflet.errors import DiffletError
    from difflet.ir.nodes import Op

    layout = node.find(Op.LAYOUT)
    if layout and any(n.op == "split" for n in layout[0].body):
        raise DiffletError(f"{node.name!r} is split: the neuron backend builds it with "
                           "neuron_spmd.emit_spmd, not as a single-core trace", where=node.loc)
    os.environ.setdefault("NEURON_COMPILE_CACHE_URL", str(compile_cache_dir(dest)))
    set_platform_target()
    args = compiler_args(str(node.attrs.get("role")))
    program, aliases, dropped = aliased_program(pm)
    vector_runtime_inputs(program, runtime_positions(node))  # runtime values as [1]: see neuron_inputs
    workdir = dest / "neuronx-cc"
    try:
        # docs frameworks/torch/torch-neuronx/api-reference-guide/inference/api-torch-neuronx-trace.rst:
        # compiler_args is str or list[str]; aliases are keys of the module's parameters (neuron_state.py)
        traced = torch_neuronx.trace(program, trace_inputs(node), compiler_workdir=str(workdir),
                                     compiler_args=args, inline_weights_to_neff=False,
                                     input_output_aliases=aliases)
    except Exception as err:  # neuronx-cc reports failures as generic exceptions
        raise DiffletError(f"neuronx-cc failed for {node.name!r}: {err} (logs in {workdir})", where=node.loc) from None
    torch_neuronx.replace_weights(traced, {k: torch.zeros_like(v) for k, v in pm.state_dict().items()})
    meta = json.dumps({"sdk_release": SDK_RELEASE, "compiler_args": args, "dropped_outputs": dropped,
                       "vector_inputs": runtime_positions(node)})
    # inside the program file, so the ART's hard link carries it
    torch.jit.save(traced, str(dest / PROGRAM_FILE), _extra_files={META_FILE: meta})
    shutil.rmtree(workdir, ignore_errors=True)
