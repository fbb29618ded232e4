"""Presharded rank weights for the neuron SPMD program (difflet/codegen/neuron_spmd.py), on CPU.

Oracles: NxD's own rules, encoded from neuronx-distributed 2.29 source and named where used:
`src/neuronx_distributed/parallel_layers/layers.py` (`set_weight_and_bias_config` shapes and which
parameters get partition attributes) and `src/neuronx_distributed/trace/trace.py`
(`create_local_weight`, what `shard_children` / `shard_checkpoint` apply to a parameter with
partition_dim, partition_stride, num_partitions); and the unsplit module's own state dict. On a
trn2 host `on_trn2` builds the real NxD module and runs NxD's shard_checkpoint.
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


def nxd_shapes(lin: torch.nn.Linear, style: str, tp: int) -> dict[str, tuple[int, ...]]:
    """layers.py set_weight_and_bias_config for the NxD layer nxd_layer builds from `lin`:
    ColumnParallelLinear weight (output_size_per_partition, input_size) and
    `bias_size = output_size if gather_output else output_size_per_partition`;
    RowParallelLinear weight (output_size, input_size_per_partition), bias (output_size,)."""
    out, inp = lin.out_features, lin.in_features
    if style == "row":
        shapes = {"weight": (out, inp // tp), "bias": (out,)}
    else:
        shapes = {"weight": (out // tp, inp), "bias": (out if style == "column_gather" else out // tp,)}
    return shapes if lin.bias is not None else {"weight": shapes["weight"]}


def create_local_weight(rank, world_size, full_weight, partition_dim, per_partition_size, stride):
    """trace/trace.py create_local_weight, as written there (split by per_partition_size/stride,
    take [rank::world_size], concatenate when stride > 1)."""
    weight_list = torch.split(full_weight, per_partition_size // stride, dim=partition_dim)
    mine = weight_list[rank::world_size]
    return torch.cat(mine, dim=partition_dim) if stride > 1 else mine[0]


def _denoiser(dsl: str):
    from conftest import REPO
    from oracle_util import random_checkpoint

    from difflet.codegen.build import build_program_module
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    planned = optimize(lower_file(str(REPO / "models" / dsl)), f"tp{TP}", target="trn2", backend="neuron")
    node = planned.components("denoiser")[0]
    pm = build_program_module(node, random_checkpoint(planned))
    return node, pm, linear_specs(node, pm.model)


@pytest.mark.parametrize("dsl", ["flux-tiny.dsl", "qwen-image-tiny.dsl"])
def test_every_split_linear_shard_has_the_nxd_layers_shape(dsl):
    """layers.py: bias_size = output_size if gather_output else output_size_per_partition, so a
    column_gather (modulation) bias stays whole, and a row bias is not parallelized."""
    _, pm, specs = _denoiser(dsl)
    state = pm.state_dict()
    ranks = preshard(state, specs, TP)
    gathered = [p for p, (s, _) in specs.items() if s == "column_gather"]
    assert gathered  # FLUX norm*.linear, Qwen-Image img_mod.1 / txt_mod.1
    for path, (style, _) in specs.items():
        lin = pm.model.get_submodule(path)
        for leaf, shape in nxd_shapes(lin, style, TP).items():
            key = f"model.{path}.{leaf}"
            assert all(tuple(r[key].shape) == shape for r in ranks), (key, style, ranks[0][key].shape, shape)
            if leaf == "bias" and style != "column":  # no partition attributes: every rank the whole bias
                assert all(torch.equal(r[key], state[key]) for r in ranks), key


def test_column_shards_are_nxd_create_local_weight_of_the_full_tensor(split_flux):
    """What shard_children gives a parameter with partition attributes (dim 0, stride 1)."""
    _, pm, specs = split_flux
    state, ranks = pm.state_dict(), preshard(pm.state_dict(), specs, TP)
    for path, (style, _) in specs.items():
        if style == "row":
            continue
        key = f"model.{path}.weight"
        for r in range(TP):
            want = create_local_weight(r, TP, state[key], 0, state[key].shape[0] // TP, 1)
            assert torch.equal(ranks[r][key], want), key


def test_a_segmented_row_split_is_nxds_plain_split_of_the_rank_major_weight(split_flux):
    """FLUX's single-block proj_out reads [attention 32 | mlp 128]: each rank needs its chunk of
    BOTH segments. NxD's partition_stride cannot say that for unequal segments (no stride gives
    the same columns), so nxd_preshard hands shard_checkpoint the rank-major permutation, whose
    plain (stride 1) split is exactly each rank's segmented shard."""
    from difflet.codegen.neuron_spmd import rank_major

    _, pm, specs = split_flux
    path = "single_transformer_blocks.0.proj_out"
    style, segments = specs[path]
    assert style == "row" and segments == (32, 128)
    key = f"model.{path}.weight"
    full = pm.state_dict()[key]
    ranks = preshard(pm.state_dict(), specs, TP)
    per = full.shape[1] // TP
    perm = rank_major(full, segments, TP)
    assert sorted(perm.sum(0).tolist()) == sorted(full.sum(0).tolist())  # a permutation of the columns
    for r in range(TP):
        assert torch.equal(create_local_weight(r, TP, perm, 1, per, 1), ranks[r][key])
    for stride in (s for s in range(1, per + 1) if per % s == 0):
        assert not torch.equal(create_local_weight(0, TP, full, 1, per, stride), ranks[0][key]), stride


def _standin_spmd(pm, specs):
    """Meta-device STAND-IN of the SPMD module: each split Linear at NxD's shapes (`nxd_shapes`)."""
    def make(lin, style):
        m = torch.nn.Module()
        for leaf, shape in nxd_shapes(lin, style, TP).items():
            setattr(m, leaf, torch.nn.Parameter(torch.empty(shape, dtype=lin.weight.dtype, device="meta")))
        return m

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


@on_trn2
def test_nxds_shard_checkpoint_gives_the_same_rank_files(split_flux):
    from difflet.codegen.neuron_spmd import nxd_preshard

    _, pm, specs = split_flux
    want, got = preshard(pm.state_dict(), specs, TP), nxd_preshard(pm, pm.state_dict(), specs, TP)
    assert [w.keys() for w in want] == [g.keys() for g in got]
    assert all(torch.equal(w[k], g[k]) for w, g in zip(want, got) for k in w)
