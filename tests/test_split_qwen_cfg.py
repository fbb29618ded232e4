"""TP2+CFG2 for a model with true CFG: qwen-image-tiny planned at `tp2+cfg2` (cpu) on 4 gloo ranks,
as the runtime loads it (codegen/cfg_program.py: a CfgProgram over two replicas of the tp2 inner
program, eager here; cfg group 0 = ranks 0, 1 runs the prompt, group 1 = ranks 2, 3 the negative
prompt from the `uncond_*` twin inputs with their own valid_text), called ONCE with both passes'
inputs. It returns both predictions, which must equal the UNSPLIT diffusers QwenImageTransformer2DModel
run once per prompt (text padding masked with diffusers' own encoder_hidden_states_mask); the
combination QwenImagePipeline applies is then the host's (difflet/families/qwen_image/host.py), written out
here as the oracle and applied to both sides:
    comb = neg + s * (cond - neg);  noise = comb * (||cond|| / ||comb||)   (norms over the last dim)
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from difflet.codegen.split_layout import layout_of
from difflet.ir.nodes import Op

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
    """(prompt, negative prompt) inputs of one pass each (hidden_states, encoder_hidden_states,
    timestep, valid_text): same latents and timestep, different text embeddings and valid_text."""
    from difflet.codegen.build import example_inputs
    from difflet.passes.cfg_branch import cond_view

    x = list(example_inputs(cond_view(node)))
    neg = list(x)
    neg[1] = torch.randn(x[1].shape, generator=torch.Generator().manual_seed(3))
    x[-1], neg[-1] = torch.tensor(pair[0]), torch.tensor(pair[1])
    return tuple(x), tuple(neg)


def _cfg_call(node, pair):
    """The cfg program's one call: the prompt's inputs, then the negative prompt's twins."""
    x, neg = _branches(node, pair)
    return (*x, neg[1], neg[3])


def _combine(cond, neg):
    comb = neg + SCALE * (cond - neg)
    return comb * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))


def _cfg_outputs(ckpt):
    """The cfg program's outputs per pair: codegen_cfg's CfgProgram over two eager tp2 replicas."""
    from difflet.codegen.cfg_program import eager_cfg_program
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    module = optimize(lower_file(str(QWEN_TINY)), parallel="tp2+cfg2", target="cpu")
    node = module.component("transformer")
    assert [n.name for n in node.find(Op.INPUT)][4:] == ["uncond_encoder_hidden_states", "uncond_valid_text"]
    assert layout_of(node).attrs["groups"]["cfg"] == ((0, 2), (1, 3))  # tp innermost: {0,1} prompt, {2,3} negative
    with eager_cfg_program(module, node, ckpt, timeout=900) as prog:
        assert [p.world for p in prog.groups] == [2, 2]
        return [prog(*_cfg_call(node, pair)) for pair in PAIRS]


@pytest.mark.slow  # four rank processes (about 55 s): not in the quick tier
def test_tp2_cfg2_true_cfg_equals_unsplit_diffusers_pipeline_combine(difflet_test_store):
    import diffusers

    from difflet.codegen.checkpoint import resolve_weights
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    ckpt = resolve_weights(optimize(lower_file(str(QWEN_TINY)), parallel="tp1", target="cpu"), "random:0",
                           difflet_test_store)
    ref = diffusers.QwenImageTransformer2DModel.from_pretrained(str(ckpt), subfolder="transformer").eval()
    node = _plan("tp2+cfg2")
    want, cond_only, neg_only = [], [], []
    with torch.no_grad():
        for pair in PAIRS:
            cond, neg = (ref(hidden_states=x[0], encoder_hidden_states=x[1], encoder_hidden_states_mask=_mask(v),
                             timestep=x[2], img_shapes=[(1, GRID, GRID)], return_dict=False)[0]
                         for x, v in zip(_branches(node, pair), pair))
            want.append(_combine(cond, neg))
            cond_only.append(cond)
            neg_only.append(neg)
    got = [_cfg_outputs(str(ckpt))]  # rank 0 of each group returns its pass's full prediction
    err = 0.0
    for outs in got:
        for pair, (g_cond, g_neg), w, c, n in zip(PAIRS, outs, want, cond_only, neg_only):
            e = max((g_cond - c).abs().max().item(), (g_neg - n).abs().max().item(),
                    (_combine(g_cond, g_neg) - w).abs().max().item())
            assert e <= TOL, f"(valid_text prompt, negative) = {pair}: max abs {e:.2e}"
            err = max(err, e)
    # the passes differ far more than the split error: swapped or ignored branches could not pass
    moved = min((c - n).abs().max().item() for c, n in zip(cond_only, neg_only))
    print(f"tp2+cfg2 true CFG: split error {err:.2e}, branches differ by >= {moved:.2e} "
          f"(ratio {moved / max(err, 1e-12):.1e})")
    assert moved > 100 * max(err, 1e-7)
