"""Persistent device state for neuron programs: an aliased output instead of an in-place update.

torch_neuronx.trace (Neuron SDK 2.29, "PyTorch NeuronX Tracing API": `input_output_aliases` marks
a module tensor as state kept on the device) and NxD's BaseModelInstance take the state as
`{tensor: output_index}`: the program returns the new value at that output and the runtime writes
it back into the state's device memory. An in-place `copy_` is not that: through torch.export ->
StableHLO the mutation is silently dropped (measured with torch-xla on CPU, shared/notes), and
ModelBuilder V2 lists in-place updates as unsupported.

The alias keys are the module's PARAMETERS: NxD Inference declares its KV cache as
`nn.Parameter(..., requires_grad=False)` (modules/kvcache/kv_cache_manager.py) and aliases those
(models/model_wrapper.py `self.input_output_aliases[past_key_values[i]] = ...`); torch_neuronx's
trace looks the keys up among the module's parameters (its source is not public; the NxD Inference
usage is the reference). So the state, a buffer in the eager probe, is a Parameter here.

Invariant: `aliased_program(pm)` computes exactly what `pm` computes; its extra outputs are the
new state values, at the indices it returns as `dropped` (the runner never hands them to the host).
A module opts in with `STATE` (buffer names) and `compute(*args) -> (*outputs, *new_state)`.
"""
from __future__ import annotations

import torch


class AliasedState(torch.nn.Module):
    """Mixin ahead of the probe's class: `forward` is `compute`, state returned out of place."""

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.compute(*args))


def _aliased_copy(pm: torch.nn.Module, names: tuple[str, ...]) -> torch.nn.Module:
    """A shallow copy of pm (same submodules and tensors) of class Aliased<cls>, whose STATE
    buffers are Parameters (requires_grad=False) over the same storage, under the same names, so
    the state-dict keys are pm's (what replace_weights gets from the ART's weights file) and
    `compute` reads the program's own state (also after `.to()` moves the program)."""
    cls = type(pm)
    aliased = type(f"Aliased{cls.__name__}", (AliasedState, cls), {})
    program = aliased.__new__(aliased)
    program.__dict__.update(pm.__dict__)
    program.__dict__["_modules"] = dict(pm._modules)
    program.__dict__["_parameters"] = dict(pm._parameters)
    program.__dict__["_buffers"] = {k: v for k, v in pm._buffers.items() if k not in names}
    program.__dict__["_non_persistent_buffers_set"] = set(pm._non_persistent_buffers_set) - set(names)
    for name in names:
        program._parameters[name] = torch.nn.Parameter(pm._buffers[name], requires_grad=False)
    return program


def aliased_program(pm: torch.nn.Module) -> tuple[torch.nn.Module, dict, list[int]]:
    """(module to trace, input_output_aliases, indices of state outputs); a stateless pm unchanged.

    A stateful pm declares STATE (buffer names) and OUTPUTS (how many real outputs `compute`
    returns before the new state values); the aliases' keys are the program's state Parameters."""
    names = tuple(getattr(pm, "STATE", ()))
    if not names:
        return pm, {}, []
    program, first = _aliased_copy(pm, names), int(pm.OUTPUTS)
    params = dict(program.named_parameters())
    aliases = {params[name]: first + i for i, name in enumerate(names)}
    return program, aliases, list(range(first, first + len(names)))
