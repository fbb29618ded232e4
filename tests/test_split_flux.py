"""Split flux-tiny4 (4 heads) on real gloo ranks equals the UNSPLIT diffusers FluxTransformer2DModel.

Every configuration the planner calls legal on cpu among tp2, tp4, tp4+sp, tp2cp2 x {ulysses, ring,
gather_kv}, cp4 x {ulysses, ring} (and tp2cp2+sp ring) is built per rank by codegen's split_layout (presharded
ParallelLinears, SP regions, CP joint attention) from the same random:0 checkpoint, run eagerly,
and compared with diffusers' own model (with a key mask when valid_text < T, as
test_codegen_attention does). The 4-rank configurations share one launch; tp2 has its own.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from difflet.parallel.launch import run_ranks

FLUX_TINY4 = Path(__file__).resolve().parent.parent / "models" / "flux-tiny4.dsl"
T = 32
VALID = (1, 4, 11, 20, 32)  # >= 5 runtime values from 1 to max_text
FOUR = [("tp4", None), ("tp4+sp", None), ("tp2cp2", "ulysses"), ("tp2cp2", "ring"),
        ("tp2cp2", "gather_kv"), ("cp4", "ulysses"), ("cp4", "ring"), ("tp2cp2+sp", "ring")]
TWO = [("tp2", None)]
BF16 = ("tp2cp2", "ulysses")
TOL = 1e-4
pytestmark = pytest.mark.slow  # six rank processes on two cores (about 70 s): not in the quick tier


def _plan(parallel, attention):
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    return optimize(lower_file(str(FLUX_TINY4)), parallel=parallel,
                    attention=attention, target="cpu")


def _inputs(node):
    """(program inputs, diffusers' forward inputs): example inputs, with the host's RoPE tables
    (families/flux/host.py) for the program where diffusers takes FluxPipeline's position ids."""
    from diffusers import FluxPipeline

    from difflet.codegen.build import example_inputs
    from difflet.families.flux.host import rope_tables

    prog, ref = list(example_inputs(node)), list(example_inputs(node))
    prog[4], prog[5] = rope_tables((4, 6, 6), 8, 8, T, torch.float32, torch.float32)  # img_rope, txt_rope
    ref[4], ref[5] = FluxPipeline._prepare_latent_image_ids(1, 8, 8, "cpu", torch.float32), torch.zeros(T, 3)
    return prog, ref


def _sweep_body(rank, world, configs, ckpt, valids, bf16):
    """On this rank: every config's split denoiser output at every valid_text (and one bf16 run)."""
    from difflet.codegen.split_codegen import degrees
    from difflet.codegen.split_layout import build_rank_module
    from difflet.parallel.groups import make_groups

    out = {}
    for parallel, attention in configs:
        node = _plan(parallel, attention).component("transformer")
        pm = build_rank_module(node, ckpt, make_groups(degrees(node)))
        x = _inputs(node)[0]
        with torch.no_grad():
            out[parallel, attention] = [pm(*x[:-1], torch.tensor(v))[0] for v in valids]
            if (parallel, attention) == bf16:
                pm = pm.to(torch.bfloat16)
                xb = [t.to(torch.bfloat16) if t.is_floating_point() and i not in (4, 5) else t  # tables: float32
                      for i, t in enumerate(x[:-1])]
                out["bf16"] = pm(*xb, torch.tensor(T))[0].float()
    return out


@pytest.fixture(scope="module")
def flux4(difflet_test_store):
    """(checkpoint, inputs, diffusers reference model, oracle outputs per valid_text)."""
    import diffusers

    from difflet.codegen.checkpoint import resolve_weights

    module = _plan("tp1", None)
    ckpt = resolve_weights(module, "random:0", difflet_test_store)
    x = _inputs(module.component("transformer"))[1]
    ref = diffusers.FluxTransformer2DModel.from_pretrained(str(ckpt), subfolder="transformer").eval()
    seq = T + x[0].shape[1]
    oracle = {}
    with torch.no_grad():
        for v in VALID:
            mask = torch.ones(1, 1, 1, seq, dtype=torch.bool)
            mask[..., v:T] = False  # diffusers' joint order is [text, visual]: mask text keys >= v
            kw = None if v == T else {"attention_mask": mask}
            oracle[v] = ref(*x[:-1], joint_attention_kwargs=kw, return_dict=False)[0]
    return ckpt, x, ref, oracle


@pytest.fixture(scope="module")
def sweep(flux4):
    ckpt = str(flux4[0])
    ranks = run_ranks(_sweep_body, 4, FOUR, ckpt, VALID, BF16, timeout=900)
    ranks2 = run_ranks(_sweep_body, 2, TWO, ckpt, VALID, None, timeout=600)
    return ranks, ranks2


@pytest.mark.parametrize("parallel,attention", TWO + FOUR)
def test_split_equals_unsplit_diffusers_at_every_valid_text(sweep, flux4, parallel, attention):
    ranks = sweep[1] if (parallel, attention) in TWO else sweep[0]
    oracle = flux4[3]
    for r, got in enumerate(ranks):
        for v, out in zip(VALID, got[parallel, attention]):
            err = (out - oracle[v]).abs().max().item()
            assert err <= TOL, f"{parallel} {attention} rank {r} valid_text={v}: max abs {err:.2e}"
    # the runtime value matters far more than the split error (else equality would prove little)
    got = ranks[0][parallel, attention]
    err = max((o - oracle[v]).abs().max().item() for v, o in zip(VALID, got))
    moved = min((got[i] - got[-1]).abs().max().item() for i in range(len(VALID) - 1))
    print(f"{parallel} {attention}: split error {err:.2e}, valid_text moves output >= {moved:.2e} "
          f"(ratio {moved / max(err, 1e-12):.1e})")
    assert moved > 100 * max(err, 1e-7)


def test_bf16_split_cosine_to_unsplit_bf16(sweep, flux4):
    _, x, ref, _ = flux4
    ref_bf16 = type(ref).from_pretrained(str(flux4[0]), subfolder="transformer",
                                         torch_dtype=torch.bfloat16).eval()
    with torch.no_grad():
        want = ref_bf16(*[t.to(torch.bfloat16) if t.is_floating_point() else t for t in x[:-1]],
                        return_dict=False)[0].float()
    got = sweep[0][0]["bf16"]
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    print(f"bf16 {BF16}: cosine {cos:.6f}")
    assert cos >= 0.9999
