"""Apply a planned `layout` to one rank's denoiser: the per-rank program module of a split plan.

Invariants:
- The layout node is the only truth read: `split` nodes say which linears become which
  ParallelLinear (a column split whose output the layout all-gathers as `modulation` is
  column_gather; `segments` make a row split per segment), `attention` nodes give each site's
  CP mode, attrs give tp/cp/sp and the local token counts.
- Weights are sharded here, once, from the full checkpoint module: the returned module holds
  only this rank's shards, so its state dict is the rank's presharded weights.
- The rank program takes the *full* IR inputs (identical on every rank) and returns the *full*
  IR outputs on every rank: it slices its visual shard of the visual inputs itself (no
  communication) and all-gathers its output shard over tp (with SP) and then cp. So a split
  program has exactly the call convention of an unsplit one.
- Supported: FLUX (diffusers.FluxTransformer2DModel) and Qwen-Image (QwenImageTransformer2DModel,
  split_qwen.py) with any tp, cp (ulysses|ring|gather_kv)
  and sp; cfg, dp and other classes raise DiffletError naming the component.
"""
from __future__ import annotations

import fnmatch
import os

import torch

from difflet.codegen.attention import FluxBoundedAttnProcessor, install_attention
from difflet.codegen.build import ProgramModule, build_program_module, program_inputs
from difflet.codegen.split_qwen import QwenSplitAttnProcessor
from difflet.errors import DiffletError
from difflet.ir.nodes import Node, Op
from difflet.parallel.joint_attention import joint_attention
from difflet.parallel.layers import ParallelLinear, sp_shard

# Per class: visual inputs (name -> token dim), SP entry modules (their outputs become token
# shards), module prefixes whose linears see a joint [text, visual] sequence.
CLASS_FACTS = {
    "diffusers.FluxTransformer2DModel": {
        "visual_inputs": {"hidden_states": 1, "img_ids": 0},
        "visual_outputs": {"sample": 1},
        "sp_entries": ("context_embedder", "x_embedder"),
        "joint_prefixes": ("single_transformer_blocks.",),
    },
    "diffusers.QwenImageTransformer2DModel": {
        "visual_inputs": {"hidden_states": 1},
        "visual_outputs": {"sample": 1},
        "sp_entries": ("txt_in", "img_in"),
        "joint_prefixes": (),  # double-stream only: no linear sees the joint sequence
    },
}


def layout_of(node: Node) -> Node:
    found = node.find(Op.LAYOUT)
    if len(found) != 1:
        raise DiffletError(f"component {node.name!r} has {len(found)} layout nodes; run `difflet opt`",
                           where=node.loc)
    return found[0]


def unsupported_reason(node: Node) -> str | None:
    """Why codegen cannot build this component's layout (None when it can): the planner's own
    verdict (difflet/passes/built.py), so `--list-legal` and codegen never disagree."""
    from difflet.passes.built import layout_reason

    layout_of(node)  # a component without exactly one layout is not planned
    return layout_reason(node)


class FluxSplitAttnProcessor(FluxBoundedAttnProcessor):
    """Flux attention whose joint attention runs over the CP group in `mode` (heads = this rank's
    TP shard). The text length is the static T: under SP the stream inputs are token shards."""

    fixed_text_len = True

    def __init__(self, text_len: int, text_first: bool, mode: str, group) -> None:
        super().__init__(text_len, text_first)
        self.mode, self.group = mode, group

    def attend(self, q, k, v, text_len, valid_text):
        t = self.text_len
        if valid_text is None:
            valid_text = torch.tensor(t, dtype=torch.int64, device=q.device)
        txt = slice(0, t) if self.text_first else slice(q.shape[2] - t, q.shape[2])
        vis = slice(t, q.shape[2]) if self.text_first else slice(0, q.shape[2] - t)
        mode = "gather_kv" if self.mode == "local" else self.mode  # size-1 group: plain bounded attention
        out_vis, out_txt = joint_attention(mode, q[:, :, vis], k[:, :, vis], v[:, :, vis], q[:, :, txt],
                                           k[:, :, txt], v[:, :, txt], valid_text, self.group)
        return torch.cat([out_txt, out_vis] if self.text_first else [out_vis, out_txt], dim=2)


# Which split processor serves which class (same constructor: text_len, text_first, mode, group).
SPLIT_PROCESSORS = {"diffusers.FluxTransformer2DModel": FluxSplitAttnProcessor,
                    "diffusers.QwenImageTransformer2DModel": QwenSplitAttnProcessor}


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
    la = layout.attrs
    facts = CLASS_FACTS[node.attrs["class"]]
    tp, cp, sp = int(la["tp"]), int(la["cp"]), bool(la["sp"])
    tp_group, cp_group = _group(groups, "tp", tp), _group(groups, "cp", cp)
    tp_index = groups.index("tp") if tp > 1 else 0
    text, vis = int(la["local_tokens"]["text"]), int(la["local_tokens"]["visual"])
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
            joint = name.startswith(facts["joint_prefixes"])
            _set_module(model, name, ParallelLinear.from_linear(
                lin, style, tp_group, tp_index, tp, segments=split.attrs.get("segments"), sp=sp,
                token_segments=(text, vis) if joint else None))
            count += 1
    if sp:
        for name in facts["sp_entries"]:
            # the hook's return replaces the output: the stream becomes this rank's token shard
            model.get_submodule(name).register_forward_hook(lambda _m, _i, out: sp_shard(out, tp_group))
    _install_split_attention(model, node, layout, cp_group, text)
    return count


def _install_split_attention(model, node: Node, layout: Node, cp_group, text_len: int) -> None:
    install_attention(model, node)  # validates sites, heads and order against the model
    orders = {a.name: tuple(a.attrs.get("order", ("text", "visual"))) for a in node.find(Op.ATTENTION)}
    modules = dict(model.named_modules())
    processor = SPLIT_PROCESSORS[node.attrs["class"]]
    for site in (n for n in layout.body if n.op == Op.ATTENTION):
        mode = site.attrs["mode"]
        for name, mod in modules.items():
            if fnmatch.fnmatchcase(name, site.name):
                mod.set_processor(processor(text_len, orders.get(site.name, ("text",))[0] == "text",
                                            mode, cp_group if mode != "local" else None))


class RankProgramModule(ProgramModule):
    """A rank's program: full inputs in, its visual shard taken, full outputs gathered back."""

    def __init__(self, model: torch.nn.Module, node: Node, groups) -> None:
        super().__init__(model, node)
        la = layout_of(node).attrs
        facts = CLASS_FACTS[node.attrs["class"]]
        tp, cp = int(la["tp"]), int(la["cp"])
        self.sp = bool(la["sp"])
        self.tp_group, self.cp_group = _group(groups, "tp", tp), _group(groups, "cp", cp)
        self.cp, self.cp_index = cp, groups.index("cp") if cp > 1 else 0
        self.visual_in = [facts["visual_inputs"].get(v.name) for v in program_inputs(node)]
        self.visual_out = [facts["visual_outputs"].get(n.name) for n in node.find(Op.OUTPUT)]

    def forward(self, *inputs):
        from difflet.parallel import comm
        from difflet.parallel.linears import shard

        inputs = tuple(x if d is None or self.cp == 1 else shard(x, d, self.cp_index, self.cp)
                       for x, d in zip(inputs, self.visual_in))
        outs = super().forward(*inputs)
        gathered = []
        for y, d in zip(outs, self.visual_out):
            if d is not None:
                y = comm.all_gather(y, d, self.tp_group) if self.sp else y
                y = comm.all_gather(y, d, self.cp_group)
            gathered.append(y)
        return tuple(gathered)


def build_rank_module(node: Node, ckpt_dir: str | os.PathLike, groups) -> ProgramModule:
    """This rank's program module for `node`'s layout (world 1: the ordinary program module)."""
    reason = unsupported_reason(node)
    if reason:
        raise DiffletError(f"component {node.name!r}: {reason}", where=layout_of(node).loc)
    if layout_of(node).attrs.get("world", 1) == 1:
        return build_program_module(node, ckpt_dir)
    from difflet.codegen.checkpoint import load_component

    model = load_component(node, ckpt_dir)
    apply_layout(model, node, groups)
    return RankProgramModule(model, node, groups).eval()
