"""CFG parallel with the split denoiser: cond and uncond run in separate cfg rank groups (cfg2 x tp2
on 4 gloo ranks, each cfg group a tp2-split flux-tiny4), combined by cfg_combine; equals diffusers'
unsplit true-CFG combination uncond + s * (cond - uncond) (as FluxPipeline's true_cfg_scale does).

The planner refuses cfg2 for FLUX (its guidance is embedded, one pass), so the groups are made here
directly; codegen builds cfg layouts for the true-CFG families (tests/test_cfg_parallel.py)."""
from __future__ import annotations

from pathlib import Path

import torch

from difflet.parallel.launch import run_ranks

FLUX_TINY4 = Path(__file__).resolve().parent.parent / "models" / "flux-tiny4.dsl"
T, SCALE, VALID = 32, 4.0, (20, 7)  # cond and uncond prompts of different lengths


def _node():
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    return optimize(lower_file(str(FLUX_TINY4)), parallel="tp2", target="cpu").component("transformer")


def _branches(node):
    """(cond, uncond) full input tuples: the same latents, different text conditioning."""
    from difflet.codegen.build import example_inputs

    x = list(example_inputs(node))
    g = torch.Generator().manual_seed(1)
    un = list(x)
    un[1], un[2] = torch.randn(x[1].shape, generator=g), torch.randn(x[2].shape, generator=g)
    return (*x[:-1], torch.tensor(VALID[0])), (*un[:-1], torch.tensor(VALID[1]))


def _cfg_body(rank, world, ckpt):
    from difflet.codegen.split_layout import build_rank_module
    from difflet.parallel.groups import make_groups
    from difflet.parallel.linears import cfg_combine

    node = _node()
    groups = make_groups(dict(cfg=2, tp=2))  # tp innermost: ranks {0,1} cond, {2,3} uncond
    pm = build_rank_module(node, ckpt, groups)
    with torch.no_grad():
        pred = pm(*_branches(node)[groups.index("cfg")])[0]
        return cfg_combine(pred, groups.group("cfg"), SCALE)


def test_cfg_groups_with_split_denoiser_equal_unsplit_true_cfg(difflet_test_store):
    import diffusers

    from difflet.codegen.checkpoint import resolve_weights
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    ckpt = resolve_weights(optimize(lower_file(str(FLUX_TINY4)), parallel="tp1", target="cpu"), "random:0",
                           difflet_test_store)
    ref = diffusers.FluxTransformer2DModel.from_pretrained(str(ckpt), subfolder="transformer").eval()
    preds = []
    with torch.no_grad():
        for inputs in _branches(_node()):
            *x, valid = inputs
            mask = torch.ones(1, 1, 1, T + x[0].shape[1], dtype=torch.bool)
            mask[..., int(valid):T] = False
            preds.append(ref(*x, joint_attention_kwargs={"attention_mask": mask}, return_dict=False)[0])
    want = preds[1] + SCALE * (preds[0] - preds[1])
    got = run_ranks(_cfg_body, 4, str(ckpt), timeout=600)
    for r, g in enumerate(got):
        err = (g - want).abs().max().item()
        assert err <= 1e-4, f"rank {r}: max abs {err:.2e}"
    # the branches differ: a combine that ignored one of them could not pass
    assert (preds[0] - preds[1]).abs().max().item() > 100 * 1e-4
