"""Presharded rank weights for the neuron SPMD program (difflet/codegen/neuron_spmd.py), on CPU.

Oracles: the unsplit program module's own state dict (the checkpoint as the program sees it) and
the layout's Megatron shapes. The SPMD module here is a STAND-IN built on the meta device with
plain Linears of each rank's shard shape under the same names NxD's Column/RowParallelLinear use
(`weight`, `bias`) plus SPMDRank's `rank` parameter; on a trn2 host `on_trn2` builds the real NxD
module and compares its state dict with the same rank files.
"""
from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from difflet.codegen.neuron_spmd import RANK_KEY, linear_specs, preshard, shard_modules, unshard

HAS_NXD = importlib.util.find_spec("neuronx_distributed") is not None
on_trn2 = pytest.mark.skipif(not HAS_NXD, reason="needs neuronx-distributed (Neuron SDK 2.29) on a trn2 host")
TP = 2


@pytest.fixture(scope="module")
def split_flux():
    from conftest import FLUX_TINY_DSL
    from oracle_util import random_checkpoint

    from difflet.codegen.build import build_program_module
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    planned = optimize(lower_file(str(FLUX_TINY_DSL)), f"tp{TP}", target="cpu", backend="inductor")
    node = planned.component("transformer")
    pm = build_program_module(node, random_checkpoint(planned))
    return node, pm, linear_specs(node, pm.model)


def _standin_spmd(pm, specs):
    """Meta-device STAND-IN of the SPMD module: each split Linear at its rank-shard shape."""
    def make(lin, style):
        rows, cols = lin.out_features, lin.in_features
        rows, cols = (rows, cols // TP) if style == "row" else (rows // TP, cols)
        return torch.nn.Linear(cols, rows, bias=lin.bias is not None, device="meta", dtype=lin.weight.dtype)

    spmd = copy.deepcopy(pm).to("meta")
    shard_modules(spmd.model, specs, make)
    spmd.spmd_rank = torch.nn.Module()
    spmd.spmd_rank.rank = torch.nn.Parameter(torch.zeros(1, dtype=torch.int32, device="meta"), requires_grad=False)
    return spmd


def test_layout_splits_are_found(split_flux):
    _, _, specs = split_flux
    styles = {s for s, _ in specs.values()}
    assert styles == {"column", "column_gather", "row"}
    assert specs["single_transformer_blocks.0.proj_out"] == ("row", (32, 128))


def test_rank_files_match_the_spmd_state_dict_and_concatenate_back(split_flux, tmp_path):
    from safetensors.torch import load_file, save_file

    _, pm, specs = split_flux
    state = pm.state_dict()
    want = {k: (tuple(v.shape), v.dtype) for k, v in _standin_spmd(pm, specs).state_dict().items()}
    loaded = []
    for r, rank in enumerate(preshard(state, specs, TP)):
        path = tmp_path / f"transformer.rank{r}.safetensors"
        save_file(rank, str(path))
        got = load_file(str(path))
        assert {k: (tuple(v.shape), v.dtype) for k, v in got.items()} == want
        assert torch.equal(got[RANK_KEY], torch.tensor([r], dtype=torch.int32))
        loaded.append(got)
    back = unshard(loaded, specs)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    # the two ranks really hold different halves of a column-split weight
    key = "model.transformer_blocks.0.attn.to_q.weight"
    assert not torch.equal(loaded[0][key], loaded[1][key])


@on_trn2
def test_nxd_module_state_dict_matches_the_rank_files(split_flux):
    from neuronx_distributed import NxDParallelState
    from neuronx_distributed.parallel_layers.layers import SPMDRank

    from difflet.codegen.neuron_spmd import nxd_layer

    _, pm, specs = split_flux
    ranks = preshard(pm.state_dict(), specs, TP)
    with NxDParallelState(world_size=TP, tensor_model_parallel_size=TP):
        spmd = copy.deepcopy(pm)
        shard_modules(spmd.model, specs, nxd_layer)
        spmd.spmd_rank = SPMDRank(world_size=TP)
        got = {k: (tuple(v.shape), v.dtype) for k, v in spmd.state_dict().items()}
    assert got == {k: (tuple(v.shape), v.dtype) for k, v in ranks[0].items()}
