"""Float64-free RoPE (difflet/codegen/rope.py) against diffusers' own float64 tables.

Oracle: the unmodified diffusers module on the same positions. Tolerances: FLUX's angles are
float32 products pos * inv_freq (|angle| <= 128 at 2048 px), so cos/sin can differ by about
|angle| * 2**-24 ~ 1e-5; 5e-5 still fails for a wrong theta, axis order or interleave (errors of
order 1). LTX-2's frequencies come from the host's float64 values, so its tables must be
bit-identical to diffusers' (the LTX-2 oracle test compares decoded uint8 video exactly).
"""
from __future__ import annotations

import copy

import pytest
import torch

from difflet.codegen.rope import install_fp32_rope


def _flux_ids(side: int, text: int) -> torch.Tensor:
    ids = torch.zeros(text + side * side, 3)
    rows, cols = torch.meshgrid(torch.arange(side, dtype=torch.float32), torch.arange(side, dtype=torch.float32),
                                indexing="ij")
    ids[text:, 1], ids[text:, 2] = rows.reshape(-1), cols.reshape(-1)
    return ids


@pytest.mark.parametrize("side", [4, 128])
def test_flux_rope_equals_diffusers_float64_tables(side):
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    ref = FluxPosEmbed(10000, [16, 56, 56])
    ids = _flux_ids(side, 16)
    want = ref(ids)
    mine = copy.deepcopy(ref)
    assert install_fp32_rope(torch.nn.ModuleList([mine])) == 1
    got = mine(ids)
    for w, g in zip(want, got, strict=True):
        assert g.dtype == w.dtype == torch.float32 and g.shape == w.shape
        torch.testing.assert_close(g, w, atol=5e-5, rtol=0)


def test_flux_rope_exports_without_float64():
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    m = FluxPosEmbed(10000, [4, 6, 6])
    install_fp32_rope(torch.nn.ModuleList([m]))
    ep = torch.export.export(m, (_flux_ids(4, 8),), strict=False)
    dtypes = {n.meta["val"].dtype for n in ep.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)}
    assert torch.float64 not in dtypes


@pytest.mark.parametrize("rope_type", ["interleaved", "split"])
def test_ltx2_rope_equals_diffusers_float64_tables_and_exports_without_float64(rope_type):
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoRotaryPosEmbed

    ref = LTX2AudioVideoRotaryPosEmbed(dim=4096, rope_type=rope_type, modality="video")
    coords = ref.prepare_video_coords(1, 8, 16, 24, device=torch.device("cpu"))
    want = ref(coords)
    mine = copy.deepcopy(ref)
    assert install_fp32_rope(torch.nn.ModuleList([mine])) == 1
    got = mine(coords)
    for w, g in zip(want, got, strict=True):
        assert torch.equal(g, w)  # the host computes exactly what diffusers computes

    class Call(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rope = mine

        def forward(self, c):
            return self.rope(c)

    ep = torch.export.export(Call(), (coords,), strict=False)
    assert all(n.meta["val"].dtype != torch.float64 for n in ep.graph.nodes
               if isinstance(n.meta.get("val"), torch.Tensor))


def test_ltx2_connector_rope_is_replaced():
    from diffusers.pipelines.ltx2.connectors import LTX2RotaryPosEmbed1d

    ref = LTX2RotaryPosEmbed1d(dim=128, base_seq_len=4096, theta=10000.0)
    want = ref(1, 64, device=torch.device("cpu"))
    mine = copy.deepcopy(ref)
    assert install_fp32_rope(torch.nn.ModuleList([mine])) == 1
    for w, g in zip(want, mine(1, 64, device=torch.device("cpu")), strict=True):
        assert torch.equal(g, w)  # the host computes exactly what diffusers computes
