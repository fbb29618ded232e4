"""Float64-free rotary position embeddings, installed on every component program before export.

Neuron cores have no FP64 (AWS Neuron SDK 2.2x architecture docs: NeuronCore-v3 data types are
FP32/TF32/BF16/FP16/FP8 and integers), but diffusers computes some RoPE tables in float64 on CPU,
which puts f64 ops into traced graphs (`difflet check --target trn2` names them). Each family
declares, in its programs.py (difflet/families/<family>/), a replacement per RoPE submodule class
(`FP32_ROPE`); the families whose RoPE already exports without float64 declare none.

Invariant: `install_fp32_rope(model)` only replaces how a table is computed, never which table:
tests/test_neuron_rope.py compares each replaced module with diffusers' float64 result.
"""
from __future__ import annotations

import torch


def install_fp32_rope(model: torch.nn.Module) -> int:
    """Replace float64 RoPE computations in `model` (module docstring); returns how many."""
    from difflet.codegen.declarations import class_registry

    fixes = class_registry("FP32_ROPE")  # submodule class name -> fn(module) -> replaced
    count = 0
    for module in model.modules():
        fix = fixes.get(type(module).__name__)
        if fix is not None and fix(module):
            count += 1
    return count
