"""Split qwen-image-tiny (text padding MASKED) on real gloo ranks equals the UNSPLIT diffusers model.

Every configuration the planner calls legal on cpu among tp2, tp4, tp4+sp, tp2cp2 x {ulysses, ring,
gather_kv}, cp4 x {ulysses, ring, gather_kv}, tp2cp2+sp x all three (cfg/dp layouts are not built by
codegen yet) is built per rank by codegen's split_layout (presharded
ParallelLinears, SP regions, CP joint attention via families/qwen_image/attention.py's processor) from one random:0
checkpoint, run eagerly, and compared with diffusers' QwenImageTransformer2DModel with
encoder_hidden_states_mask = [1]*valid + [0]*pad (its own masked joint attention). Also:
- valid_text moves the output far more than the split error (else equality proves little);
- padding keys' contents change nothing, bit for bit (they get weight exactly 0);
- world 1 (Difflet's unsplit processor) matches too, and configs the planner rejects are rejected
  with their rule: tp1+cfg4 on cpu (guidance has 2 branches), gather_kv on trn2 (masked fused
  attention needs equal query and key lengths).
The 4-rank configurations share one launch; tp2 has its own.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from difflet.parallel.launch import run_ranks
from oracle_util import check_split_outputs

QWEN_TINY = Path(__file__).resolve().parent.parent / "models" / "qwen-image-tiny.dsl"
T = 16
GRID = 8  # 64 x 64 profile, VAE 4x, 2x2 patches: an 8 x 8 grid of 64 visual tokens
VALID = (1, 3, 7, 12, 16)  # >= 5 runtime values from 1 to max_text
FOUR = [("tp4", None), ("tp4+sp", None), ("tp2cp2", "ulysses"), ("tp2cp2", "ring"),
        ("tp2cp2", "gather_kv"), ("cp4", "ulysses"), ("cp4", "ring"), ("cp4", "gather_kv"),
        ("tp2cp2+sp", "ulysses"), ("tp2cp2+sp", "ring"), ("tp2cp2+sp", "gather_kv")]
TWO = [("tp2", None)]
PAD_VALID = 5  # valid_text of the padding-contents check
TOL = 1e-4


def _plan(parallel, attention, target="cpu"):
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    return optimize(lower_file(str(QWEN_TINY)), parallel=parallel, attention=attention, target=target)


def _repad(x):
    """Inputs with the text padding (tokens >= PAD_VALID) replaced by other values: the stream
    there differs, so every layer's padding keys/values differ."""
    x = list(x)
    enc = x[1].clone()
    enc[:, PAD_VALID:] = torch.randn(enc[:, PAD_VALID:].shape, generator=torch.Generator().manual_seed(7)) * 3
    x[1] = enc
    return tuple(x)


def _sweep_body(rank, world, configs, ckpt, valids):
    """On this rank: every config's split output at every valid_text, plus the padding check pair."""
    from difflet.codegen.build import example_inputs
    from difflet.codegen.split_codegen import degrees
    from difflet.codegen.split_layout import build_rank_module
    from difflet.parallel.groups import make_groups

    out = {}
    for parallel, attention in configs:
        node = _plan(parallel, attention).component("transformer")
        pm = build_rank_module(node, ckpt, make_groups(degrees(node)))
        x = example_inputs(node)[:-1]
        with torch.no_grad():
            out[parallel, attention] = [pm(*x, torch.tensor(v))[0] for v in valids]
            pad = torch.tensor(PAD_VALID)
            out["pad", parallel, attention] = (pm(*x, pad)[0], pm(*_repad(x), pad)[0])
    return out


def _oracle_mask(v):
    return torch.tensor([[1] * v + [0] * (T - v)], dtype=torch.int64)


@pytest.fixture(scope="module")
def qwen(difflet_test_store):
    """(checkpoint, inputs, diffusers reference model, oracle outputs per valid_text)."""
    import diffusers

    from difflet.codegen.build import example_inputs
    from difflet.codegen.checkpoint import resolve_weights

    module = _plan("tp1", None)
    ckpt = resolve_weights(module, "random:0", difflet_test_store)
    x = example_inputs(module.component("transformer"))[:-1]
    ref = diffusers.QwenImageTransformer2DModel.from_pretrained(str(ckpt), subfolder="transformer").eval()
    assert GRID * GRID == x[0].shape[1]
    oracle = {}
    with torch.no_grad():
        for v in VALID:
            oracle[v] = ref(hidden_states=x[0], encoder_hidden_states=x[1],
                            encoder_hidden_states_mask=_oracle_mask(v), timestep=x[2],
                            img_shapes=[(1, GRID, GRID)], return_dict=False)[0]
    return ckpt, x, ref, oracle


@pytest.fixture(scope="module")
def sweep(qwen):
    ckpt = str(qwen[0])
    ranks = run_ranks(_sweep_body, 4, FOUR, ckpt, VALID, timeout=900)
    ranks2 = run_ranks(_sweep_body, 2, TWO, ckpt, VALID, timeout=600)
    return ranks, ranks2


def _check(got, oracle, what):
    return check_split_outputs(got, oracle, VALID, TOL, what, "valid_text")


@pytest.mark.slow  # rank processes on two cores (about 70 s): the full suite runs it, the quick tier not
@pytest.mark.parametrize("parallel,attention", TWO + FOUR)
def test_split_equals_unsplit_diffusers_at_every_valid_text(sweep, qwen, parallel, attention):
    ranks = sweep[1] if (parallel, attention) in TWO else sweep[0]
    for r, got in enumerate(ranks):
        _check(got[parallel, attention], qwen[3], f"{parallel} {attention} rank {r}")


@pytest.mark.slow  # rank processes on two cores (about 70 s): the full suite runs it, the quick tier not
@pytest.mark.parametrize("parallel,attention", TWO + FOUR)
def test_padding_contents_change_nothing(sweep, parallel, attention):
    ranks = sweep[1] if (parallel, attention) in TWO else sweep[0]
    for r, got in enumerate(ranks):
        a, b = got["pad", parallel, attention]
        # one program, inputs equal wherever they can reach the output: exact by construction
        assert torch.equal(a, b), f"{parallel} {attention} rank {r}: padding contents moved the output " \
                                  f"by {(a - b).abs().max().item():.2e}"


def test_unsplit_difflet_processor_equals_diffusers(qwen):
    """World 1: Difflet's Qwen processor (joint_bounded_attention, text first) vs diffusers' mask."""
    from difflet.codegen.split_layout import build_rank_module

    module = _plan("tp1", None)
    pm = build_rank_module(module.component("transformer"), qwen[0], None)
    x = qwen[1]
    with torch.no_grad():
        got = [pm(*x, torch.tensor(v))[0] for v in VALID]
        pad = torch.tensor(PAD_VALID)
        assert torch.equal(pm(*x, pad)[0], pm(*_repad(x), pad)[0])  # one module, masked rows only: exact
        # ...and the repadding is no no-op: once those keys are valid, it moves the output
        full = torch.tensor(T)
        assert not torch.allclose(pm(*x, full)[0], pm(*_repad(x), full)[0], atol=1e-3)
    _check(got, qwen[3], "tp1 (unsplit Difflet)")


def test_planner_rejects_gather_kv_where_masked_attention_needs_equal_lengths():
    from difflet.errors import DiffletError

    with pytest.raises(DiffletError, match="masked-equal-qk"):
        _plan("tp2cp2", "gather_kv", target="trn2")


def test_planner_rejects_cfg4_on_cpu():
    from difflet.errors import DiffletError

    with pytest.raises(DiffletError, match="guidance has exactly 2 branches"):
        _plan("tp1+cfg4", None)
