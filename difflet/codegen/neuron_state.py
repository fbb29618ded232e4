"""Persistent device state for neuron programs: an aliased output instead of an in-place update.

torch_neuronx.trace (Neuron SDK 2.29, "PyTorch NeuronX Tracing API": `input_output_aliases` marks
a module tensor as state kept on the device) and NxD's BaseModelInstance take the state as
`{buffer: output_index}`: the program returns the new value at that output and the runtime writes
it back into the buffer's device memory. An in-place `copy_` is not that: through torch.export ->
StableHLO the mutation is silently dropped (measured with torch-xla on CPU, shared/notes), and
ModelBuilder V2 lists in-place updates as unsupported.

Invariant: `aliased_program(pm)` computes exactly what `pm` computes; its extra outputs are the
new state values, at the indices it returns as `dropped` (the runner never hands them to the host).
A module opts in with `STATE` (buffer names) and `compute(*args) -> (*outputs, *new_state)`.
"""
from __future__ import annotations

import torch


class AliasedStateProgram(torch.nn.Module):
    """`pm.compute` with the state returned out of place: (*outputs, *new_state).

    pm's submodules, parameters and buffers are registered here under their own names (not
    under a submodule), so the traced program's state-dict keys are pm's: the keys
    `replace_weights` receives from the ART's weights file (`program_weights(pm)`)."""

    def __init__(self, pm: torch.nn.Module) -> None:
        super().__init__()
        self._modules.update(pm._modules)
        self._parameters.update(pm._parameters)
        self._buffers.update(pm._buffers)
        object.__setattr__(self, "_compute", pm.compute)  # pm's method, not a registered submodule

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self._compute(*args))


def aliased_program(pm: torch.nn.Module) -> tuple[torch.nn.Module, dict, list[int]]:
    """(module to trace, input_output_aliases, indices of state outputs); a stateless pm unchanged.

    A stateful pm declares STATE (buffer names) and OUTPUTS (how many real outputs `compute`
    returns before the new state values)."""
    names = tuple(getattr(pm, "STATE", ()))
    if not names:
        return pm, {}, []
    buffers, first = dict(pm.named_buffers()), int(pm.OUTPUTS)
    aliases = {buffers[name]: first + i for i, name in enumerate(names)}
    return AliasedStateProgram(pm), aliases, list(range(first, first + len(names)))
