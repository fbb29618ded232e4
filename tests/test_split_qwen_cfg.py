"""TP2+CFG2 for a model with true CFG: qwen-image-tiny planned at `tp2+cfg2` (cpu) on 4 gloo ranks
equals the UNSPLIT diffusers QwenImageTransformer2DModel run twice, combined the way
QwenImagePipeline does (true_cfg_scale with a negative prompt):
    comb = neg + s * (cond - neg);  noise = comb * (||cond|| / ||comb||)   (norms over the last dim)

cfg group 0 (ranks 0, 1: a tp2 pair) runs the prompt with its valid length, cfg group 1 (ranks 2, 3)
the negative prompt with a different valid length, both as runtime valid_text values of one
module per rank; difflet.parallel.linears.cfg_combine_renorm combines across the cfg group. The
oracle masks text padding with diffusers' own encoder_hidden_states_mask and applies the formula
written out here, independent of Difflet's combine.

build_rank_module refuses cfg layouts (codegen does not build them yet; test_split_compiled checks
that), so each rank's module is made by the same steps after that guard: load the checkpoint,
apply the tp2+cfg2 plan's layout (its tp splits; the cfg axis changes no module), wrap it as the
rank program.
"""
from __future__ import annotations

from pathlib import Path

import torch

from difflet.parallel.launch import run_ranks

QWEN_TINY = Path(__file__).resolve().parent.parent / "models" / "qwen-image-tiny.dsl"
T, GRID, SCALE, TOL = 16, 8, 4.0, 1e-4
PAIRS = ((12, 5), (16, 3), (4, 9), (7, 1))  # (prompt valid_text, negative prompt valid_text)


def _plan(parallel):
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    return optimize(lower_file(str(QWEN_TINY)), parallel=parallel, target="cpu").component("transformer")


def _mask(v):
    return torch.tensor([[1] * v + [0] * (T - v)], dtype=torch.int64)


def _branches(node, pair):
    """(prompt, negative prompt) program input tuples (hidden_states, encoder_hidden_states,
    timestep, valid_text): same latents and timestep, different text embeddings and valid_text."""
    from difflet.codegen.build import example_inputs

    x = list(example_inputs(node))
    neg = list(x)
    neg[1] = torch.randn(x[1].shape, generator=torch.Generator().manual_seed(3))
    x[-1], neg[-1] = torch.tensor(pair[0]), torch.tensor(pair[1])
    return tuple(x), tuple(neg)


def _cfg_body(rank, world, ckpt):
    from difflet.codegen.checkpoint import load_component
    from difflet.codegen.split_codegen import degrees
    from difflet.codegen.split_layout import RankProgramModule, apply_layout, layout_of
    from difflet.parallel.groups import make_groups
    from difflet.parallel.linears import cfg_combine_renorm

    node = _plan("tp2+cfg2")
    groups = make_groups(degrees(node))  # tp innermost: ranks {0,1} prompt, {2,3} negative prompt
    la = layout_of(node).attrs
    assert groups.ranks["cfg"] in la["groups"]["cfg"] and groups.ranks["tp"] in la["groups"]["tp"]
    model = load_component(node, ckpt)
    assert apply_layout(model, node, groups) > 0
    pm = RankProgramModule(model, node, groups).eval()
    out = []
    with torch.no_grad():
        for pair in PAIRS:
            pred = pm(*_branches(node, pair)[groups.index("cfg")])[0]
            out.append(cfg_combine_renorm(pred, groups.group("cfg"), SCALE))
    return out


def test_tp2_cfg2_true_cfg_equals_unsplit_diffusers_pipeline_combine(difflet_test_store):
    import diffusers

    from difflet.codegen.checkpoint import resolve_weights
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    ckpt = resolve_weights(optimize(lower_file(str(QWEN_TINY)), parallel="tp1", target="cpu"), "random:0",
                           difflet_test_store)
    ref = diffusers.QwenImageTransformer2DModel.from_pretrained(str(ckpt), subfolder="transformer").eval()
    node = _plan("tp2+cfg2")
    want, cond_only = [], []
    with torch.no_grad():
        for pair in PAIRS:
            cond, neg = (ref(hidden_states=x[0], encoder_hidden_states=x[1], encoder_hidden_states_mask=_mask(v),
                             timestep=x[2], img_shapes=[(1, GRID, GRID)], return_dict=False)[0]
                         for x, v in zip(_branches(node, pair), pair))
            comb = neg + SCALE * (cond - neg)
            want.append(comb * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True)))
            cond_only.append(cond)
    got = run_ranks(_cfg_body, 4, str(ckpt), timeout=900)
    err = 0.0
    for r, outs in enumerate(got):
        for pair, g, w in zip(PAIRS, outs, want):
            e = (g - w).abs().max().item()
            assert e <= TOL, f"rank {r} (valid_text prompt, negative) = {pair}: max abs {e:.2e}"
            err = max(err, e)
    # guidance moves the output far more than the split error: a combine that dropped the negative
    # branch (or a negative pass that ignored its own text) could not pass
    moved = min((w - c).abs().max().item() for w, c in zip(want, cond_only))
    print(f"tp2+cfg2 true CFG: split error {err:.2e}, guidance moves output >= {moved:.2e} "
          f"(ratio {moved / max(err, 1e-12):.1e})")
    assert moved > 100 * max(err, 1e-7)
