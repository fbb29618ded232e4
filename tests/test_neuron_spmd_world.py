"""The SPMD module form (`neuron_spmd.shard_modules`) RUN on CPU: a simulated tp world whose
parallel linears are TEST DOUBLES of NxD's, loaded with the presharded rank weights.

The doubles encode neuronx-distributed 2.29 `src/neuronx_distributed/parallel_layers/layers.py`:
- ColumnParallelLinear: `set_weight_and_bias_config` weight (out/tp, in); bias
  `bias_size = output_size if gather_output else output_size_per_partition`; `forward` multiplies
  with bias=None, gathers the last dim (`_cpl_maybe_gather_output` ->
  mappings.py `gather_from_tensor_model_parallel_region` / `_gather_along_last_dim`) when
  gather_output, THEN adds the bias.
- RowParallelLinear: weight (out, in/tp), bias (out,) ("bias is not parallelized"); `forward`
  multiplies with bias=None, `_rpl_maybe_reduce_output` casts to reduce_dtype, all-reduces
  (sum), casts back, then adds the bias.
The world is one thread per rank; a collective waits for every rank (a barrier) and the test
sums or concatenates the tensors in rank order. Nothing here calls Difflet's `unshard` or its
ParallelLinear: the oracle is the unsplit program module's own output.
"""
from __future__ import annotations

import copy
import threading

import pytest
import torch
import torch.nn.functional as F

from difflet.codegen.neuron_spmd import RANK_KEY, linear_specs, preshard, shard_modules

TP = 2


class SimWorld:
    """tp ranks as threads: `exchange(rank, t)` returns every rank's tensor in rank order."""

    def __init__(self, tp: int) -> None:
        self.tp, self.slots = tp, [None] * tp
        self.barrier = threading.Barrier(tp, timeout=120)

    def exchange(self, rank: int, t: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = t
        self.barrier.wait()
        got = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before every rank has read it
        return got


class ColumnParallelLinearDouble(torch.nn.Module):
    """layers.py ColumnParallelLinear (shapes and forward as in the module docstring)."""

    def __init__(self, lin: torch.nn.Linear, gather_output: bool, world: SimWorld, rank: int) -> None:
        super().__init__()
        out, tp = lin.out_features, world.tp
        self.weight = torch.nn.Parameter(torch.empty(out // tp, lin.in_features), requires_grad=False)
        bias_size = out if gather_output else out // tp  # layers.py set_weight_and_bias_config
        self.bias = torch.nn.Parameter(torch.empty(bias_size), requires_grad=False) if lin.bias is not None else None
        self.gather_output, self.world, self.rank = gather_output, world, rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight)  # _forward_impl(..., bias=None)
        if self.gather_output:
            out = torch.cat(self.world.exchange(self.rank, out), dim=-1)
        return out + self.bias if self.bias is not None else out


class RowParallelLinearDouble(torch.nn.Module):
    """layers.py RowParallelLinear with input_is_parallel=True (see the module docstring)."""

    def __init__(self, lin: torch.nn.Linear, reduce_dtype: torch.dtype, world: SimWorld, rank: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(lin.out_features, lin.in_features // world.tp),
                                         requires_grad=False)
        self.bias = torch.nn.Parameter(torch.empty(lin.out_features), requires_grad=False) \
            if lin.bias is not None else None
        self.reduce_dtype, self.world, self.rank = reduce_dtype, world, rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight)
        dtype = out.dtype
        parts = self.world.exchange(self.rank, out.to(self.reduce_dtype))
        out = torch.stack(parts).sum(0).to(dtype)
        return out + self.bias if self.bias is not None else out


def rank_module(pm: torch.nn.Module, specs: dict, weights: dict, world: SimWorld, rank: int) -> torch.nn.Module:
    """The module shard_modules builds (NxD layers replaced by the doubles), strictly loaded
    with rank `rank`'s weight dict: a wrong shard shape fails the load."""
    def make(lin, style):
        if style == "row":
            return RowParallelLinearDouble(lin, lin.weight.dtype, world, rank)
        return ColumnParallelLinearDouble(lin, style == "column_gather", world, rank)

    m = copy.deepcopy(pm)
    shard_modules(m.model, specs, make)
    m.spmd_rank = torch.nn.Module()  # layers.py SPMDRank: one int32 parameter `rank`
    m.spmd_rank.rank = torch.nn.Parameter(torch.zeros(1, dtype=torch.int32), requires_grad=False)
    m.load_state_dict(weights, strict=True)
    return m.eval()


def run_world(pm, specs: dict, ranks: list[dict], inputs: tuple) -> list[tuple]:
    """Every rank's outputs of the SPMD module form on its own weights, run in lockstep."""
    world = SimWorld(len(ranks))
    modules = [rank_module(pm, specs, w, world, r) for r, w in enumerate(ranks)]
    outs, errors = [None] * len(ranks), []

    def run(r):
        try:
            with torch.no_grad():
                outs[r] = modules[r](*inputs)
        except BaseException as err:  # a failing rank must not leave the others at the barrier
            errors.append(err)
            world.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(ranks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return outs


def split_denoiser(dsl: str):
    from conftest import REPO
    from oracle_util import random_checkpoint

    from difflet.codegen.build import build_program_module, example_inputs
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    planned = optimize(lower_file(str(REPO / "models" / dsl)), f"tp{TP}", target="trn2", backend="neuron")
    node = planned.components("denoiser")[0]
    pm = build_program_module(node, random_checkpoint(planned)).eval()
    return node, pm, linear_specs(node, pm.model), example_inputs(node)


@pytest.mark.parametrize("dsl", ["flux-tiny.dsl", "qwen-image-tiny.dsl"])
def test_the_spmd_module_form_on_presharded_weights_equals_the_unsplit_module(dsl):
    node, pm, specs, inputs = split_denoiser(dsl)
    assert {s for s, _ in specs.values()} == {"column", "column_gather", "row"}
    with torch.no_grad():
        want = pm(*inputs)
    ranks = preshard(pm.state_dict(), specs, TP)
    assert [int(r[RANK_KEY]) for r in ranks] == list(range(TP))
    for got in run_world(pm, specs, ranks, inputs):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_the_world_double_really_communicates():
    """The gathering column double concatenates the ranks' row blocks and adds the WHOLE bias
    once: on each rank it equals the unsplit Linear."""
    torch.manual_seed(0)
    lin, x = torch.nn.Linear(8, 6), torch.randn(2, 8)
    world = SimWorld(TP)
    col = [ColumnParallelLinearDouble(lin, True, world, r) for r in range(TP)]
    for r, c in enumerate(col):
        c.weight.data.copy_(lin.weight.detach()[r * 3:(r + 1) * 3])
        c.bias.data.copy_(lin.bias.detach())
    outs = [None] * TP
    threads = [threading.Thread(target=lambda r=r: outs.__setitem__(r, col[r](x))) for r in range(TP)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert all(torch.allclose(o, lin(x), atol=1e-6) for o in outs)
