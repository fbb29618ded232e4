"""The step-caching probe module every family's `ProbeDecl.build` returns, minus its feature.

Invariants (difflet/codegen/probe.py reads them):
- `prev_feature` is a registered buffer shaped as the IR's `feature` output, in the denoiser's
  dtype; `forward(*inputs)` returns `(score,)` and updates the buffer in place (export keeps
  the mutation inside the program); `compute(*inputs)` returns (score, feature) and never
  touches the state (the neuron backend aliases the state as an output instead).
- score = mean|f - prev| / mean|prev| in float32 (the IR's "rel_l1"), whatever the dtype.
- A subclass gives only `feature(named)`: the first block's modulated visual input, computed
  with the denoiser's own submodules exactly as its forward does (the probe tests compare it
  with the input the whole diffusers module hands its first attention).
"""
from __future__ import annotations

import torch


class FeatureProbe(torch.nn.Module):
    """Saved-feature state and the relative-L1 score around a family's `feature()`."""

    STATE, OUTPUTS = ("prev_feature",), 1  # compute() returns (score, new prev_feature)

    def __init__(self, feature_shape: tuple[int, ...], inputs: list[str], dtype: torch.dtype) -> None:
        super().__init__()
        self.inputs = list(inputs)
        self.register_buffer("prev_feature", torch.zeros(feature_shape, dtype=dtype))

    def feature(self, named: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must compute its feature")

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor]:
        score, feature = self.compute(*args)
        self.prev_feature.copy_(feature)  # in place: export records a buffer mutation
        return (score,)

    def compute(self, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(score, new feature) without touching the state."""
        feature = self.feature(dict(zip(self.inputs, args, strict=True)))
        prev = self.prev_feature.float()
        score = (feature.float() - prev).abs().mean() / prev.abs().mean().clamp_min(1e-30)
        return score, feature.to(self.prev_feature.dtype)
