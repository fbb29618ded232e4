"""Split (tensor-parallel) components on Neuron: ONE SPMD program for all ranks via NxD ModelBuilder.

Written against neuronx-distributed of Neuron SDK 2.29 (docs libraries/neuronx-distributed/
model_builder_v2_api_reference.rst: `NxDParallelState`, `ModelBuilder(model).trace(args=, tag=)
.compile(compiler_args=, compiler_workdir=)`, `set_weights([per-rank state dicts])`, `to_neuron()`,
`save(path)`; layers `ColumnParallelLinear(in, out, bias, gather_output)`,
`RowParallelLinear(in, out, bias, input_is_parallel=True)` and `SPMDRank` from
`neuronx_distributed.parallel_layers`). Untested here: no Neuron SDK on this host.

Invariants:
- One traced program serves every rank: the rank is the weight `spmd_rank.rank` (int32 [1], NxD's
  SPMDRank), never a Python int in the graph; collectives live inside NxD's parallel layers.
- Rank weights follow NxD's own partition rules (`PARTITION`, from parallel_layers/layers.py):
  column weight and non-gathered bias rows, a gathered (column_gather) bias WHOLE (added after
  the gather), row weight columns per input segment, row bias whole. On a trn2 host they come
  from NxD's `shard_checkpoint` on the NxD-layer module (`nxd_preshard`; a segmented row weight
  is handed over rank-major, which NxD's stride cannot express); without the SDK from
  `preshard`. Rank r's dict has exactly the SPMD module's state-dict keys, shapes and dtypes and
  is written as weights/<name>.rank<r>.safetensors; `unshard` inverts `preshard`.
- Only tp layouts are built (no sp, no cp): their attention is rank-local ("local" mode); which
  classes is difflet/passes/built.py `spmd_built()`, from the families' facts (the planner's and codegen's one list).
- The store entry (key: the component's cache key, which covers its layout) holds the program
  without weights (`NxDModel.save`'s default `save_weights=False`); codegen links it into ART/ once
  per rank (`programs/<name>.rank<r>.pt2`, one file: the runtime's rank-file check names ranks) and
  writes the rank weights itself, so the store never holds a checkpoint's values.
- The traced forward names the IR inputs (ModelBuilder V2 refuses `*args`) and runtime values
  are traced as shape-[1] tensors (neuron_inputs.py); neuron_load.SpmdProgram
  loads the program once (NxDModel.load), sets the rank files as its weights and feeds them so.
"""
from __future__ import annotations

import fnmatch
import shutil
from typing import Callable

import torch

from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op

PROGRAM_FILE = "program.nxd"
RANK_KEY = "spmd_rank.rank"
PREFIX = "model."  # ProgramModule holds the component model under `model`


def linear_specs(node: Node, model: torch.nn.Module) -> dict[str, tuple[str, tuple[int, ...] | None]]:
    """Module path -> (style, row input segments) for every Linear the layout splits; style is
    column, column_gather (modulation all-gathered after) or row."""
    layout = node.find(Op.LAYOUT)[0]
    la = layout.attrs
    if la.get("sp") or int(la.get("cp", 1)) > 1:
        raise DiffletError(f"component {node.name!r}: the neuron SPMD path builds tp layouts only "
                           "(no sp, no cp) so far", where=layout.loc)
    gathered = {c.attrs["site"] for c in layout.find(Op.COLLECTIVE)
                if c.attrs.get("kind") == "all_gather" and c.attrs.get("tensor") == "modulation"}
    specs = {}
    for split in (n for n in layout.body if n.op == Op.SPLIT):
        style = "column_gather" if split.attrs["style"] == "column" and split.name in gathered else split.attrs["style"]
        for name, mod in model.named_modules():
            if fnmatch.fnmatchcase(name, split.name) and isinstance(mod, torch.nn.Linear):
                specs[name] = (style, split.attrs.get("segments"))
    return specs


# NxD's partition rule per (style, leaf): the dim a rank's shard is cut from, None for whole.
# parallel_layers/layers.py set_weight_and_bias_config: ColumnParallelLinear weight
# (out/tp, in) dim 0, bias `output_size if gather_output else output_size_per_partition` (only a
# non-gathered bias gets the partition attributes); RowParallelLinear weight (out, in/tp) dim 1,
# bias (out,) whole and added after the reduce.
PARTITION = {("column", "weight"): 0, ("column", "bias"): 0, ("column_gather", "weight"): 0,
             ("column_gather", "bias"): None, ("row", "weight"): 1, ("row", "bias"): None}


def _shard(t: torch.Tensor, style: str, segments, rank: int, tp: int, leaf: str) -> torch.Tensor:
    from difflet.parallel.layers import _row_shard, shard

    dim = PARTITION[(style, leaf)]
    if dim is None:
        return t.clone()
    if dim == 1:  # row: this rank's chunk of every input segment (one segment: plain Megatron)
        return _row_shard(t, tuple(segments or (t.shape[1],)), rank, tp)
    return shard(t, 0, rank, tp).clone()


def preshard(state: dict[str, torch.Tensor], specs: dict, tp: int) -> list[dict[str, torch.Tensor]]:
    """The full program state dict -> one dict per rank (module docstring), with `spmd_rank.rank`."""
    owner = {f"{PREFIX}{path}.{leaf}": (path, leaf) for path in specs for leaf in ("weight", "bias")}
    ranks = []
    for r in range(tp):
        out = {}
        for key, t in state.items():
            if key in owner:
                style, segments = specs[owner[key][0]]
                out[key] = _shard(t, style, segments, r, tp, owner[key][1]).contiguous()
            else:
                out[key] = t.contiguous().clone()
        out[RANK_KEY] = torch.tensor([r], dtype=torch.int32)
        ranks.append(out)
    return ranks


def unshard(ranks: list[dict[str, torch.Tensor]], specs: dict) -> dict[str, torch.Tensor]:
    """Inverse of `preshard` (without the rank key): the full state dict back from the rank dicts."""
    owner = {f"{PREFIX}{path}.{leaf}": (path, leaf) for path in specs for leaf in ("weight", "bias")}
    full = {}
    for key, t in ranks[0].items():
        if key == RANK_KEY:
            continue
        parts = [rk[key] for rk in ranks]
        dim = PARTITION[(specs[owner[key][0]][0], owner[key][1])] if key in owner else None
        if dim is None:
            full[key] = t
        elif dim == 0:
            full[key] = torch.cat(parts, dim=0)
        else:
            segments = specs[owner[key][0]][1]
            segs = [s // len(ranks) for s in (segments or (t.shape[1] * len(ranks),))]
            pieces = [p.split(segs, dim=1) for p in parts]  # per rank: its chunk of each segment
            full[key] = torch.cat([torch.cat([pr[i] for pr in pieces], dim=1) for i in range(len(segs))], dim=1)
    return full


def rank_major(weight: torch.Tensor, segments, tp: int) -> torch.Tensor:
    """A row weight's columns reordered so that NxD's plain row split (trace/trace.py
    create_local_weight, stride 1: contiguous in/tp columns per rank) gives each rank its chunk of
    every input segment. NxD's `stride` only expresses equal segments; a single-stream
    block's proj_out input is [attention | mlp], so the segmented split is a column permutation."""
    from difflet.parallel.layers import _row_shard

    return torch.cat([_row_shard(weight, tuple(segments or (weight.shape[1],)), r, tp) for r in range(tp)], dim=1)


def nxd_preshard(pm: torch.nn.Module, state: dict[str, torch.Tensor], specs: dict, tp: int) -> list[dict]:
    """`preshard` through NxD's own `shard_checkpoint` on the NxD-layer module (trn2 host): the
    layers' partition attributes decide every shard; segmented row weights go in rank-major."""
    import copy

    from neuronx_distributed import NxDParallelState, shard_checkpoint
    from neuronx_distributed.parallel_layers.layers import SPMDRank

    ckpt = dict(state)
    for path, (style, segments) in specs.items():
        if style == "row" and segments and len(segments) > 1:
            ckpt[f"{PREFIX}{path}.weight"] = rank_major(state[f"{PREFIX}{path}.weight"], segments, tp)
    # layers.py SPMDRank docstring: the checkpoint holds arange(world) as the rank, split over ranks
    ckpt[RANK_KEY] = torch.arange(tp, dtype=torch.int32)
    with NxDParallelState(world_size=tp, tensor_model_parallel_size=tp):
        # a meta skeleton: every tensor of pm replaced by an empty meta one, nothing copied
        memo = {id(t): torch.nn.Parameter(torch.empty_like(t, device="meta"), requires_grad=False)
                if isinstance(t, torch.nn.Parameter) else torch.empty_like(t, device="meta")
                for t in (*pm.parameters(), *pm.buffers())}
        model = copy.deepcopy(pm, memo)
        shard_modules(model.model, specs, lambda lin, style: nxd_layer(lin, style, device=torch.device("meta")))
        model.spmd_rank = SPMDRank(world_size=tp)
        # trace/functions.py shard_checkpoint: one dict per tp rank from the layers' attributes
        shards = shard_checkpoint(checkpoint=ckpt, model=model)
    return [{k: v.contiguous().clone() for k, v in shard.items()} for shard in shards]


def shard_weights(pm: torch.nn.Module, state: dict, specs: dict, tp: int) -> list[dict[str, torch.Tensor]]:
    """The rank weight dicts: NxD's shard_checkpoint where neuronx-distributed is installed,
    Difflet's `preshard` (the same rules, tested against NxD's source on CPU) elsewhere."""
    import importlib.util

    if importlib.util.find_spec("neuronx_distributed") is None:
        return preshard(state, specs, tp)
    return nxd_preshard(pm, state, specs, tp)


def shard_modules(model: torch.nn.Module, specs: dict, make: Callable[[torch.nn.Linear, str], torch.nn.Module]) -> None:
    """Replace each split Linear of `model` by `make(linear, style)` (NxD layers on a trn2 host)."""
    for path, (style, _) in specs.items():
        parent, _, leaf = path.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, make(model.get_submodule(path), style))


def nxd_layer(lin: torch.nn.Linear, style: str, device=None) -> torch.nn.Module:
    """The NxD parallel layer for one split Linear (under NxDParallelState; weights come later).
    Reductions in the weights' dtype, as NxD Inference's diffusers transformer passes reduce_dtype=torch_dtype
    (layers.py's default float32 would make every all-reduce float32)."""
    from neuronx_distributed.parallel_layers import ColumnParallelLinear, RowParallelLinear

    bias, dtype = lin.bias is not None, lin.weight.dtype
    # parallel_layers/layers.py RowParallelLinear / ColumnParallelLinear __init__
    if style == "row":
        return RowParallelLinear(lin.in_features, lin.out_features, bias=bias, input_is_parallel=True, dtype=dtype,
                                 device=device, reduce_dtype=dtype)
    return ColumnParallelLinear(lin.in_features, lin.out_features, bias=bias, gather_output=style == "column_gather",
                                dtype=dtype, device=device, reduce_dtype=dtype)


def compile_spmd(node: Node, pm: torch.nn.Module, specs: dict, tp: int, dest, compiler_args: list[str]) -> None:
    """Trace `pm` (the unsplit program module) once as an SPMD program of `tp` ranks and save it,
    without weights, as `dest/PROGRAM_FILE` (NxD's TorchScript format); `pm` is modified.
    `compiler_args` are argv tokens (neuron_flags.role_args), passed as ModelBuilder's string."""
    from neuronx_distributed import ModelBuilder, NxDParallelState
    from neuronx_distributed.parallel_layers.layers import SPMDRank

    from difflet.codegen.neuron import set_platform_target
    from difflet.codegen.neuron_inputs import (explicit_signature, input_names, runtime_positions, trace_inputs,
                                               vector_runtime_inputs)
    from difflet.passes.neuron_flags import as_string

    set_platform_target()

    with NxDParallelState(world_size=tp, tensor_model_parallel_size=tp):
        shard_modules(pm.model, specs, nxd_layer)
        pm.spmd_rank = SPMDRank(world_size=tp)
        vector_runtime_inputs(pm, runtime_positions(node), input_names(node))  # runtime values as [1]
        explicit_signature(pm, node)  # V2's trace refuses *args and passes the inputs by name
        # trace/model_builder_v2.py compile: compiler_args one string for every tag
        nxd = ModelBuilder(pm).trace(args=trace_inputs(node), tag=node.name).compile(
            compiler_args=as_string(compiler_args), compiler_workdir=str(dest / "neuronx-cc"))
    nxd.save(str(dest / PROGRAM_FILE))  # save_weights=False: rank weights live in ART/weights
    shutil.rmtree(dest / "neuronx-cc", ignore_errors=True)  # compiler logs, as neuron.compile_entry


def emit_spmd(comp: Node, ckpt, store, out) -> tuple:
    """A tp-only split component on neuron into ART/: the SPMD program (compiled or reused by the
    component's cache key) linked once per rank, and Difflet's presharded rank weight files.
    Returns (manifest entry, whether it compiled)."""
    from pathlib import Path

    from safetensors.torch import save_file

    from difflet.codegen.artifacts import program_paths
    from difflet.codegen.build import build_program_module
    from difflet.codegen.artifacts import manifest_entry
    from difflet.codegen.manifest import RankFiles, file_ref
    from difflet.codegen.neuron import compiler_args, program_weights
    from difflet.codegen.split_codegen import degrees, world
    from difflet.codegen.store import link_or_copy

    out, tp = Path(out), world(comp)
    pm = build_program_module(comp, ckpt, "neuron")  # NKI attention_cte at every joint site
    specs = linear_specs(comp, pm.model)
    ranks = shard_weights(pm, program_weights(pm, None), specs, tp)  # before compile_spmd swaps in NxD layers
    args = compiler_args(str(comp.attrs.get("role")))
    entry, created = store.get_or_create("neuron", comp.attrs["cache_key"],
                                         lambda tmp: compile_spmd(comp, pm, specs, tp, tmp, args),
                                         directory=True)
    files = []
    for r, weights in enumerate(ranks):
        prog_rel, weights_rel = program_paths(comp.name, r)
        link_or_copy(entry / PROGRAM_FILE, out / prog_rel)
        save_file(weights, str(out / weights_rel))
        files.append(RankFiles(file_ref(out, prog_rel), file_ref(out, weights_rel)))
    return manifest_entry(comp, comp, files, world=tp, degrees=dict(degrees(comp))), created
