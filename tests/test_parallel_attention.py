"""Distributed joint attention (Ulysses, Ring, gather_kv) on real gloo ranks equals unsplit attention.

Oracle: difflet.kernels.attention_ref.bounded_attention on the full, unsplit sequence with keys
[all visual, text] and bounds [0, V + valid_text) (itself checked against dense masked SDPA in
test_parallel_oracle.py); with no text stream (self-attention, Wan's attn1), bounded_attention
over the visual keys alone. Each world size is launched once (module fixture); every rank runs every
mode at every valid_text, plus a run with garbage in the padded text keys, and returns its outputs.
"""
from __future__ import annotations

import pytest
import torch

from difflet.parallel.launch import run_ranks
from difflet.kernels.attention_ref import bounded_attention
from difflet.passes import cp_modes

B, H, V, T, D = 1, 4, 16, 8, 8  # H and V divide by 4 (cp4) and by 2 (tp2cp2)
VALID = (1, 2, 3, 5, 8)          # >= 5 runtime values from 1 to T
MODES = cp_modes.CHOICES  # every mode a plan may choose (passes/cp_modes.py)
TOL = 1e-5


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    vis = [torch.randn(B, H, V, D, generator=g) for _ in range(3)]
    txt = [torch.randn(B, H, T, D, generator=g) for _ in range(3)]
    return vis, txt


def _poison(t: torch.Tensor, valid: int) -> torch.Tensor:
    """The same tensor with large different numbers in its padded text positions (>= valid)."""
    out = t.clone()
    out[:, :, valid:] = 1e3 * torch.randn_like(out[:, :, valid:]) + 7.0
    return out


def _rank_body(rank: int, world: int, layout: dict):
    """Every mode x valid_text on this rank's slice of the shared inputs."""
    from difflet.parallel.groups import make_groups
    from difflet.parallel.joint_attention import joint_attention, self_attention

    groups = make_groups(layout)
    tp_i, cp_i = groups.index("tp"), groups.index("cp")
    tp, cp = groups.degrees["tp"], groups.degrees["cp"]
    heads = slice(tp_i * H // tp, (tp_i + 1) * H // tp)     # TP: this rank's heads
    seq = slice(cp_i * V // cp, (cp_i + 1) * V // cp)       # CP: this rank's visual shard
    vis, txt = _inputs()
    vis = [x[:, heads, seq] for x in vis]
    txt = [x[:, heads] for x in txt]
    out = {"heads": heads, "seq": seq}
    for mode in MODES:
        out[mode, "self"] = self_attention(mode, *vis, groups.group("cp"))
        for n in VALID:
            valid = torch.tensor(n, dtype=torch.int64)
            out[mode, n] = joint_attention(mode, *vis, *txt, valid, groups.group("cp"))
            if n in (1, 5):
                bad = [txt[0], _poison(txt[1], n), _poison(txt[2], n)]
                out[mode, n, "poisoned"] = joint_attention(mode, *vis, *bad, valid, groups.group("cp"))
    return out


def _oracle(n: int):
    (qv, kv, vv), (qt, kt, vt) = _inputs()
    q, k, v = torch.cat([qv, qt], 2), torch.cat([kv, kt], 2), torch.cat([vv, vt], 2)
    out = bounded_attention(q, k, v, torch.tensor(0), torch.tensor(V + n))
    return out[:, :, :V], out[:, :, V:]


LAYOUTS = {"cp2": (2, {"cp": 2}), "cp4": (4, {"cp": 4}), "tp2cp2": (4, {"tp": 2, "cp": 2})}


@pytest.fixture(scope="module")
def results():
    """Launch each world size once: {layout name: per-rank result dicts}."""
    out = {"cp2": run_ranks(_rank_body, 2, LAYOUTS["cp2"][1])}
    # cp4 and tp2cp2 share a launch size; run them in one go to pay process startup once.
    four = run_ranks(_rank_body_pair, 4, LAYOUTS["cp4"][1], LAYOUTS["tp2cp2"][1])
    out["cp4"], out["tp2cp2"] = [r[0] for r in four], [r[1] for r in four]
    return out


def _rank_body_pair(rank: int, world: int, a: dict, b: dict):
    return _rank_body(rank, world, a), _rank_body(rank, world, b)


def _errors(ranks, mode: str, n: int) -> tuple[float, float]:
    """(max |visual error| over the reassembled shards, max |text error| over every rank)."""
    ref_vis, ref_txt = _oracle(n)
    err_v = err_t = 0.0
    for r in ranks:
        ov, ot = r[mode, n]
        err_v = max(err_v, (ov - ref_vis[:, r["heads"], r["seq"]]).abs().max().item())
        err_t = max(err_t, (ot - ref_txt[:, r["heads"]]).abs().max().item())
    return err_v, err_t


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("mode", MODES)
def test_equals_unsplit(results, layout, mode):
    worst = 0.0
    for n in VALID:
        err_v, err_t = _errors(results[layout], mode, n)
        assert err_v <= TOL and err_t <= TOL, (layout, mode, n, err_v, err_t)
        worst = max(worst, err_v, err_t)
    # valid_text must matter far more than the split error: the smallest move between two counts
    moves = [max((a - b).abs().max().item() for a, b in zip(_oracle(n0), _oracle(n1)))
             for n0, n1 in zip(VALID, VALID[1:])]
    ratio = min(moves) / max(worst, 1e-12)
    print(f"{layout} {mode}: max split error {worst:.2e}, smallest valid_text move {min(moves):.2e}, "
          f"ratio {ratio:.1e}")
    assert ratio > 1e3


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("mode", MODES)
def test_padding_contents_change_nothing(results, layout, mode):
    for r in results[layout]:
        for n in (1, 5):
            for clean, dirty in zip(r[mode, n], r[mode, n, "poisoned"]):  # one rank's code, masked
                assert torch.equal(clean, dirty), (layout, mode, n)  # rows only: exact by construction


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_text_outputs_replicated(results, layout):
    """Ranks at one TP position hold the same text output: bitwise for ulysses and gather_kv,
    to rounding for ring (each rank merges the shards in its own order)."""
    ranks = results[layout]
    for mode in MODES:
        for n in VALID:
            for r in ranks[1:]:
                peer = next(p for p in ranks if p["heads"] == r["heads"])
                a, b = r[mode, n][1], peer[mode, n][1]
                if mode == "ring":
                    # (out, lse) partials merged in a rank-dependent order: each merge rounds
                    # exp(lse_i - lse) once (~1e-7 at |out| <= 1); a wrong merge is off by ~0.1.
                    assert (a - b).abs().max().item() <= 4e-6
                else:
                    assert torch.equal(a, b), (layout, mode, n)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("mode", MODES)
def test_self_attention_without_text_equals_unsplit(results, layout, mode):
    q, k, v = _inputs()[0]
    ref = bounded_attention(q, k, v, torch.tensor(0), torch.tensor(V))
    for r in results[layout]:
        err = (r[mode, "self"] - ref[:, r["heads"], r["seq"]]).abs().max().item()
        assert err <= TOL, (layout, mode, err)


def test_every_declared_mode_is_implemented():
    """passes/cp_modes.py declares the modes and parallel/joint_attention.py implements them: the
    same names, `local` included."""
    from difflet.parallel.joint_attention import IMPLEMENTATIONS

    assert set(IMPLEMENTATIONS) == set(cp_modes.MODES)


def test_local_mode_without_group_is_plain_attention():
    from difflet.parallel.joint_attention import joint_attention, self_attention

    (qv, kv, vv), (qt, kt, vt) = _inputs()
    ref_vis, ref_txt = _oracle(3)
    out_vis, out_txt = joint_attention("local", qv, kv, vv, qt, kt, vt, torch.tensor(3), None)
    assert (out_vis - ref_vis).abs().max().item() <= TOL and (out_txt - ref_txt).abs().max().item() <= TOL
    ref = bounded_attention(qv, kv, vv, torch.tensor(0), torch.tensor(V))
    assert (self_attention("local", qv, kv, vv, None) - ref).abs().max().item() <= TOL
