"""Apply a planned `layout` to one rank's denoiser: the per-rank program module of a split plan.

Invariants:
- The layout node is the only truth read: `split` nodes say which linears become which
  ParallelLinear (a column split whose output the layout all-gathers as `modulation` is
  column_gather; `segments` make a row split per segment), `attention` nodes give each site's
  CP mode, attrs give tp/cp/sp and the local token counts; an `all_reduce` of `sum_of_squares`
  at a norm makes that RMSNorm a ParallelRMSNorm (q/k norms across heads after a column split).
- Weights are sharded here, once, from the full checkpoint module: the returned module holds
  only this rank's shards, so its state dict is the rank's presharded weights.
- The rank program takes the *full* IR inputs (identical on every rank) and returns the *full*
  IR outputs on every rank: it slices its visual shard of the visual inputs itself (no
  communication) and all-gathers its output shard over tp (with SP) and then cp. So a split
  program has exactly the call convention of an unsplit one. A class with a program `wrapper`
  (ClassDecl) is called through it, as its unsplit program is; such a wrapper holds no state.
- What the class contributes (visual inputs and outputs, SP entries, joint prefixes, the split
  attention processor, or in-model stream entries/exits and CP tables for a class that patches
  its own input, outputs and per-head RoPE tables of a stream CP replicates) is its family's
  `SplitDecl`; which classes are built at all is
  difflet/passes/built.py. Built: any tp, cp (ulysses|ring|gather_kv) and sp of those classes;
  other classes raise DiffletError naming the component. A cfg layout is two replicas of
  its inner layout's program (codegen/cfg_program.py); here it raises.
"""
from __future__ import annotations

import fnmatch
import os

import torch

from difflet.codegen.attention import install_attention
from difflet.codegen.build import build_program_module
from difflet.codegen.program import program_inputs
from difflet.codegen.program_module import ProgramModule
from difflet.codegen.declarations import declaration
from difflet.codegen.decl import SplitDecl
from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op
from difflet.passes.layout_attrs import Layout, PlannedSite, Site
from difflet.parallel.layers import ParallelLinear, ParallelRMSNorm, sp_shard


def layout_of(node: Node) -> Node:
    found = node.find(Op.LAYOUT)
    if len(found) != 1:
        raise DiffletError(f"component {node.name!r} has {len(found)} layout nodes; run `difflet opt`",
                           where=node.loc)
    return found[0]


def unsupported_reason(node: Node, backend: str = "inductor", device: str | None = None) -> str | None:
    """Why codegen cannot build this component's layout for `backend` on `device` (None when it
    can): the planner's own verdict (difflet/passes/built.py), so `--list-legal` and codegen never
    disagree."""
    from difflet.passes.built import layout_reason

    layout_of(node)  # a component without exactly one layout is not planned
    return layout_reason(node, backend, device)


def split_facts(node: Node) -> SplitDecl:
    """The split declaration of the component's class (its family's programs.py declares it)."""
    facts = declaration(node.attrs["class"]).split
    if facts is None:  # passes/built.py says built, yet no family says how: a registry bug
        raise DiffletError(f"{node.attrs['class']} is listed in its family facts' split_built but "
                           "its family's programs.py declares no split", where=node.loc)
    return facts


def _group(groups, axis: str, degree: int):
    return groups.group(axis) if degree > 1 else None


def _modulation_globs(layout: Node) -> set[str]:
    return {c.attrs["site"] for c in layout.find(Op.COLLECTIVE)
            if c.attrs.get("kind") == "all_gather" and c.attrs.get("tensor") == "modulation"}


def _set_module(model: torch.nn.Module, path: str, module: torch.nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, module)


def apply_layout(model: torch.nn.Module, node: Node, groups) -> int:
    """Shard `model`'s linears and install split attention per the layout; returns linears replaced."""
    layout = layout_of(node)
    la = Layout.of(layout)
    facts = split_facts(node)
    tp, cp, sp = la.tp, la.cp, la.sp
    tp_group, cp_group = _group(groups, "tp", tp), _group(groups, "cp", cp)
    tp_index = groups.index("tp") if tp > 1 else 0
    text, vis = la.local_tokens["text"], la.local_tokens["visual"]
    gathered = _modulation_globs(layout)
    modules = dict(model.named_modules())
    count = 0
    for split in (n for n in layout.body if n.op == Op.SPLIT):
        names = [n for n in modules if fnmatch.fnmatchcase(n, split.name)]
        if not names:
            raise DiffletError(f"split {split.name!r} matches no module of {node.attrs['class']}",
                               where=split.loc)
        style = split.attrs["style"]
        if style == "column" and split.name in gathered:
            style = "column_gather"
        for name in names:
            lin = modules[name]
            if not isinstance(lin, torch.nn.Linear):
                raise DiffletError(f"split {split.name!r}: {name} is a {type(lin).__name__}, not a Linear",
                                   where=split.loc)
            joint = name.startswith(facts.joint_prefixes)
            _set_module(model, name, ParallelLinear.from_linear(
                lin, style, tp_group, tp_index, tp, segments=split.attrs.get("segments"), sp=sp,
                token_segments=_joint_segments(node, name, text, vis) if joint else None))
            count += 1
    _shard_norms(model, node, layout, tp_group, tp_index, tp)
    if sp:
        for name in facts.sp_entries:
            # the hook's return replaces the output: the stream becomes this rank's token shard
            model.get_submodule(name).register_forward_hook(lambda _m, _i, out: sp_shard(out, tp_group))
        for name, index in facts.sp_inputs.items():
            model.get_submodule(name).register_forward_pre_hook(_shard_input(index, tp_group))
    _install_stream_hooks(model, facts, cp_group, tp_group if sp else None)
    _install_head_tables(model, facts, tp_group)
    _install_split_attention(model, node, layout, cp_group, text)
    return count


def _joint_segments(node: Node, linear: str, text: int, vis: int) -> tuple[int, int]:
    """Token counts of a joint sequence's two parts in the order of the IR attention site whose
    block holds `linear` (text first unless that site's IR order starts with visual)."""
    for site in node.find(Op.ATTENTION):
        block = site.name.split("*")[0]  # "single_transformer_blocks.*.attn" -> its blocks' prefix
        if linear.startswith(block) and not Site.of(site).text_first:
            return vis, text
    return text, vis


def _shard_input(index: int, group):
    """A pre-hook making positional input `index` this rank's SP token shard (SplitDecl.sp_inputs)."""
    def hook(_m, args):
        return (*args[:index], sp_shard(args[index], group), *args[index + 1:])
    return hook


def _shard_norms(model, node: Node, layout: Node, tp_group, tp_index: int, tp: int) -> int:
    """RMSNorms whose sum of squares the layout all-reduces over tp -> ParallelRMSNorm shards."""
    sites = [c for c in layout.find(Op.COLLECTIVE)
             if c.attrs.get("kind") == "all_reduce" and c.attrs.get("tensor") == "sum_of_squares"]
    modules = dict(model.named_modules())
    count = 0
    for site in sites:
        names = [n for n in modules if fnmatch.fnmatchcase(n, site.attrs["site"])]
        for name in names:
            if not isinstance(modules[name], torch.nn.RMSNorm):
                raise DiffletError(f"norm {site.attrs['site']!r}: {name} is a {type(modules[name]).__name__}, "
                                   "not an RMSNorm", where=site.loc)
            _set_module(model, name, ParallelRMSNorm.from_norm(modules[name], tp_group, tp_index, tp))
            count += 1
        if not names:
            raise DiffletError(f"norm {site.attrs['site']!r} matches no module of {node.attrs['class']}",
                               where=site.loc)
    return count


def _cut(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    from difflet.parallel import comm
    from difflet.parallel.linears import shard

    n = comm.size(group)
    return x if n == 1 else shard(x, dim, comm.rank(group), n)


def _install_stream_hooks(model, facts: SplitDecl, cp_group, sp_group) -> None:
    """The in-model visual shard points of SplitDecl (stream_entries, stream_exits, cp_tables)."""
    from difflet.parallel import comm

    def enter(dim):  # CP chunk first, then (SP) the TP chunk of it: RankProgramModule's order
        return lambda _m, args: (_cut(_cut(args[0], dim, cp_group), dim, sp_group), *args[1:])

    def leave(dim):
        return lambda _m, _i, out: comm.all_gather(comm.all_gather(out, dim, sp_group), dim, cp_group)

    def table(dim):
        return lambda _m, _i, out: tuple(_cut(t, dim, cp_group) for t in out) if isinstance(out, tuple) \
            else _cut(out, dim, cp_group)

    for name, dim in facts.stream_entries.items():
        model.get_submodule(name).register_forward_pre_hook(enter(dim))
    for name, dim in facts.stream_exits.items():
        model.get_submodule(name).register_forward_hook(leave(dim))
    for name, dim in facts.cp_tables.items():
        model.get_submodule(name).register_forward_hook(table(dim))


def _install_head_tables(model, facts: SplitDecl, tp_group) -> None:
    """SplitDecl.head_tables: per-head RoPE tables cut to this rank's contiguous TP shard of heads."""
    def heads(dim):
        return lambda _m, _i, out: tuple(_cut(t, dim, tp_group) for t in out) if isinstance(out, tuple) \
            else _cut(out, dim, tp_group)

    for name, dim in facts.head_tables.items():
        model.get_submodule(name).register_forward_hook(heads(dim))


def _install_split_attention(model, node: Node, layout: Node, cp_group, text_len: int) -> None:
    install_attention(model, node)  # validates sites, heads and order against the model
    text_first = {a.name: Site.of(a).text_first for a in node.find(Op.ATTENTION)}
    modules = dict(model.named_modules())
    processor = split_facts(node).processor
    for site in (n for n in layout.body if n.op == Op.ATTENTION):
        mode = PlannedSite.of(site).mode
        for name, mod in modules.items():
            if fnmatch.fnmatchcase(name, site.name):
                mod.set_processor(processor(text_len, text_first[site.name], mode,
                                            cp_group if mode != "local" else None))


def _stateless(adapter: torch.nn.Module, model: torch.nn.Module, node: Node) -> torch.nn.Module:
    """`adapter`, checked to hold no tensor of its own: only the model's reach the rank's weights."""
    mine = {id(t) for t in (*model.parameters(), *model.buffers())}
    if any(id(t) not in mine for t in (*adapter.parameters(), *adapter.buffers())):
        raise DiffletError(f"the program wrapper of {node.attrs['class']} holds tensors of its own; a split "
                           "rank program calls it outside its module tree", where=node.loc)
    return adapter


class RankProgramModule(ProgramModule):
    """A rank's program: full inputs in, its visual shard taken, full outputs gathered back."""

    def __init__(self, model: torch.nn.Module, node: Node, groups) -> None:
        super().__init__(model, node)
        la = Layout.of(layout_of(node))
        facts = split_facts(node)
        tp, cp = la.tp, la.cp
        self.sp = la.sp
        self.tp_group, self.cp_group = _group(groups, "tp", tp), _group(groups, "cp", cp)
        self.cp, self.cp_index = cp, groups.index("cp") if cp > 1 else 0
        self.visual_in = [facts.visual_inputs.get(v.name) for v in program_inputs(node)]
        self.stream_in = [facts.stream_inputs.get(v.name) for v in program_inputs(node)]
        self.visual_out = [facts.visual_outputs.get(n.name) for n in node.find(Op.OUTPUT)]
        self.sp_out = [facts.sp_outputs.get(n.name) for n in node.find(Op.OUTPUT)]
        wrap = declaration(node.attrs["class"]).wrapper
        # the class's adapter to the IR calling convention (e.g. a text mask built from
        # valid_text) over this same model, kept out of the module tree: the state dict stays model.*
        self.__dict__["adapter"] = None if wrap is None else _stateless(wrap(model, node), model, node)

    def forward(self, *inputs):
        from difflet.parallel import comm
        from difflet.parallel.linears import shard

        inputs = tuple(x if d is None or self.cp == 1 else shard(x, d, self.cp_index, self.cp)
                       for x, d in zip(inputs, self.visual_in))
        sp_group = self.tp_group if self.sp else None  # a per-token input: cut as the stream is
        inputs = tuple(x if d is None or x.ndim <= d else _cut(_cut(x, d, self.cp_group), d, sp_group)
                       for x, d in zip(inputs, self.stream_in))
        outs = super().forward(*inputs) if self.adapter is None else self.adapter(*inputs)
        gathered = []
        for y, d, s in zip(outs, self.visual_out, self.sp_out):
            if d is not None:
                y = comm.all_gather(y, d, self.tp_group) if self.sp else y
                y = comm.all_gather(y, d, self.cp_group)
            elif s is not None and self.sp:  # a stream CP replicates: only the SP shard is gathered
                y = comm.all_gather(y, s, self.tp_group)
            gathered.append(y)
        return tuple(gathered)


def build_rank_module(node: Node, ckpt_dir: str | os.PathLike, groups) -> ProgramModule:
    """This rank's program module for `node`'s layout (world 1: the ordinary program module)."""
    reason = unsupported_reason(node)
    if reason:
        raise DiffletError(f"component {node.name!r}: {reason}", where=layout_of(node).loc)
    if Layout.of(layout_of(node)).cfg > 1:  # two replicas of cond_view's program, no rank module
        raise DiffletError(f"component {node.name!r}: a cfg layout runs two replicas of its inner "
                           "program (codegen/cfg_program.py), not rank modules", where=layout_of(node).loc)
    if Layout.of(layout_of(node)).replica_world == 1:  # a dp layout's replica may be one rank
        return build_program_module(node, ckpt_dir)
    from difflet.codegen.checkpoint import load_component

    from difflet.codegen.rope import install_fp32_rope

    model = load_component(node, ckpt_dir)
    apply_layout(model, node, groups)
    install_fp32_rope(model)  # the world-1 program's RoPE tables (wrap_program_module does the same)
    return RankProgramModule(model, node, groups).eval()
