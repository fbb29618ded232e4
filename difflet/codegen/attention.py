"""Difflet's attention for denoisers: one joint bounded-attention op and its installer.

Invariants:
- The op (`joint_bounded_attention`) knows nothing about any model: it takes q/k/v over a joint
  sequence (text segment + visual segment in the model's order) and a runtime valid-text count,
  rearranges the keys as [visual, valid text, text padding] so the valid keys are one interval,
  and calls the kernel contract `bounded_attention` with bounds [0, V + valid_text). Queries
  keep the model's order, so outputs line up with the reference.
- Each installed processor's `kernel` is the implementation the program's backend chose
  (difflet/kernels/select.py: fused SDPA on inductor, NKI attention_cte on neuron), marked
  text_valid at a site without a text mask (it attends its padding: no bounds needed).
- Softmax is invariant to key order, so with valid_text == T the op equals dense attention.
- Which processor serves a class is that class's family declaration (codegen/decl.py `declaration`);
  importing this module imports no family (the registry is read inside install_attention).
"""
from __future__ import annotations

import fnmatch

import torch

from difflet.errors import DiffletError
from difflet.kernels.select import FUSED, AttentionKernel
from difflet.ir.nodes import Node, Op
from difflet.passes.layout_attrs import Site


def _text_len(node: Node) -> int:
    """The static text length: the text-stream input's sequence dimension."""
    for inp in node.find(Op.INPUT):
        if inp.name == "encoder_hidden_states":
            return inp.results[0].type.shape[1]
    raise DiffletError(f"denoiser {node.name!r} has joint attention but no encoder_hidden_states input",
                       where=node.loc)


def install_attention(model: torch.nn.Module, node: Node, kernel: AttentionKernel = FUSED) -> int:
    """Replace the processors of every joint attention site the IR's `attention` nodes name;
    returns the count.

    Self/cross sites without a text mask describe the model to the planner (heads, order) and keep
    the class's own processor: with no padding to exclude, it computes the same attention.
    Raises DiffletError for an unsupported class, a masked non-joint site, an order, or a glob
    that matches nothing.
    """
    sites = [(n, Site.of(n)) for n in node.find(Op.ATTENTION)]
    for site, decl in sites:
        if decl.kind != "joint" and decl.text_mask:
            raise DiffletError(f"attention kind {decl.kind!r} with a text mask is not "
                               f"supported for {node.attrs['class']} (only joint)", where=site.loc)
    sites = [(n, decl) for n, decl in sites if decl.kind == "joint"]
    if not sites:
        return 0
    from difflet.codegen.declarations import declaration, declared

    cls = declaration(node.attrs["class"]).processor  # the class's family declares it
    if cls is None:
        raise DiffletError(f"no Difflet attention processor for {node.attrs['class']} "
                           f"(supported: {', '.join(declared('processor'))})", where=node.loc)
    modules = dict(model.named_modules())
    count = 0
    for site, decl in sites:
        if sorted(decl.order) != ["text", "visual"]:
            raise DiffletError("joint attention order must be (text, visual) or (visual, text), "
                               f"got {decl.order}", where=site.loc)
        matched = [m for name, m in modules.items() if fnmatch.fnmatchcase(name, site.name)]
        if not matched:
            raise DiffletError(f"attention site {site.name!r} matches no module of {node.attrs['class']}",
                               where=site.loc)
        for mod in matched:
            if (getattr(mod, "heads", decl.heads), getattr(mod, "head_dim", decl.head_dim)) != \
                    (decl.heads, decl.head_dim):
                raise DiffletError(f"attention site {site.name!r}: the model has heads={mod.heads}, "
                                   f"head_dim={mod.head_dim}; the IR says {decl.heads}, {decl.head_dim}",
                                   where=site.loc)
            proc = cls(_text_len(node), text_first=decl.text_first)
            proc.kernel = kernel.for_site(decl.text_mask)  # the processors pass it to the joint ops
            mod.set_processor(proc)
            count += 1
    if hasattr(cls, "prepare_model"):  # a class whose forward needs adapting to the program convention
        cls.prepare_model(model, node)
    return count

