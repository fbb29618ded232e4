"""Distributed joint attention: [visual sharded over CP, text replicated] under one softmax.

Layout in and out (per rank, H = this rank's heads after TP, cp = size of the CP group):
  q/k/v_vis [B, H, Vl, D]  this rank's contiguous visual shard (the full visual sequence is the
                           shards in CP rank order, V = cp * Vl);
  q/k/v_txt [B, H, T, D]   the text, identical on every rank, padded to T: its first
                           `valid_text` keys are valid, the rest are padding;
  valid_text               0-d int64 tensor in [0, T] (a runtime value, never a shape).
  returns (out_vis [B, H, Vl, D] for the local shard, out_txt [B, H, T, D] replicated).

Invariants (each mode equals `bounded_attention` over the unsplit keys [all visual, text] with
bounds [0, V + valid_text)):
- padded text keys get weight exactly 0 (their contents never reach the output);
- the replicated text keys enter each softmax exactly once;
- only the kernel touches scores, so every mode runs the same contract: `kernel`
  (difflet/kernels/select.py, the program's backend chose it; default the fused SDPA path). A
  call is marked whole (every key valid by construction) when it has no text, only visual keys
  (ring's shards), or the site attends its text padding (kernel.text_valid).
Modes (declared, torch-free, in difflet/passes/cp_modes.py; implemented here, IMPLEMENTATIONS):
- ulysses:   all-to-all sequence shards -> head shards (H % cp == 0), attend the full joint
             sequence for H/cp heads, inverse all-to-all; text outputs all-gathered over heads.
             Text outputs are bitwise identical across ranks.
- ring:      local queries [visual shard, all text] vs text K/V once, then vs each visual K/V
             shard as it circulates; (out, lse) partials folded by merge_partials. Never holds
             more than two visual shards of K/V. Text outputs agree across ranks to float
             rounding only (each rank merges the shards in a different order).
- gather_kv: all-gather visual K/V, local queries vs [all visual, text]. Text outputs bitwise
             identical across ranks.
- local:     (keys CP replicates, or no CP group) gather_kv over a size-1 group.
Self-attention (no text stream, e.g. Wan's attn1): pass q/k/v_txt = None and valid_text =
None; every mode then attends the visual keys alone and returns (out_vis, None).
`report`, if given, receives `kv_bytes`: the most K/V bytes the mode holds at once for its
kernel calls, i.e. the K/V operands of a call plus a ring's in-flight receive block (measured
from the tensors, for bench/parallel.py). Collective receive buffers are dropped once copied
into those operands, so they are not held during the kernel call.
"""
from __future__ import annotations

import torch

from difflet.parallel import comm
from difflet.kernels.attention_ref import merge_partials
from difflet.kernels.select import FUSED

def _nbytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _note(report: dict | None, nbytes: int) -> None:
    if report is not None:
        report["kv_bytes"] = max(report.get("kv_bytes", 0), nbytes)


def _bounds(valid: torch.Tensor | None, offset: int, like: torch.Tensor):
    lo = torch.zeros((), dtype=torch.int64, device=like.device)
    if valid is None:  # no text stream: every key up to offset is valid
        return lo, torch.full((), offset, dtype=torch.int64, device=like.device)
    return lo, valid.to(device=like.device, dtype=torch.int64).reshape(()) + offset


def _cat(vis: torch.Tensor, txt: torch.Tensor | None) -> torch.Tensor:
    return vis if txt is None else torch.cat([vis, txt], dim=2)


def ulysses(q_vis, k_vis, v_vis, q_txt, k_txt, v_txt, valid_text, group, report=None, kernel=FUSED):
    """Joint attention by exchanging sequence shards for head shards (see module docstring)."""
    n, r = comm.size(group), comm.rank(group)
    b, h, vl, d = q_vis.shape
    if h % n:
        raise ValueError(f"ulysses needs local heads ({h}) divisible by the CP size ({n})")
    hc = h // n
    # One all-to-all for q, k and v: [n(dest head chunk), 3, B, hc, Vl, D].
    qkv = torch.stack([q_vis, k_vis, v_vis]).reshape(3, b, n, hc, vl, d).permute(2, 0, 1, 3, 4, 5)
    got = comm.all_to_all(qkv, group)  # [n(src seq shard), 3, B, hc, Vl, D]
    q, k, v = got.permute(1, 2, 3, 0, 4, 5).reshape(3, b, hc, n * vl, d).unbind(0)
    text = q_txt is not None
    if text:
        heads = slice(r * hc, (r + 1) * hc)  # text is replicated: keep one copy, this rank's heads
        q = torch.cat([q, q_txt[:, heads]], dim=2)
        k = torch.cat([k, k_txt[:, heads]], dim=2)
        v = torch.cat([v, v_txt[:, heads]], dim=2)
    del got  # the receive buffer is copied into q/k/v: release it before attention
    _note(report, _nbytes(k, v))
    lo, hi = _bounds(valid_text, n * vl, q)
    out = kernel(q, k, v, lo, hi, whole=valid_text is None or kernel.text_valid)  # [B, hc, V + T, D]
    vis = out[:, :, : n * vl].reshape(b, hc, n, vl, d).permute(2, 0, 1, 3, 4)
    vis = comm.all_to_all(vis, group)  # [n(src head chunk), B, hc, Vl, D]
    out_vis = vis.permute(1, 0, 2, 3, 4).reshape(b, h, vl, d)
    out_txt = comm.all_gather(out[:, :, n * vl:], 1, group) if text else None
    return out_vis, out_txt


def ring(q_vis, k_vis, v_vis, q_txt, k_txt, v_txt, valid_text, group, report=None, kernel=FUSED):
    """Joint attention with local queries and circulating visual K/V (see module docstring)."""
    n = comm.size(group)
    vl = q_vis.shape[2]
    q = _cat(q_vis, q_txt)
    run = None
    if q_txt is not None:
        run = kernel(q, k_txt, v_txt, *_bounds(valid_text, 0, q), return_stats=True,
                     whole=valid_text is None or kernel.text_valid)
    kv = torch.stack([k_vis, v_vis])  # one rotation moves both
    full = _bounds(None, vl, q)  # every visual key is valid
    text_bytes = 0 if k_txt is None else _nbytes(k_txt, v_txt)
    for step in range(n):
        nxt = comm.rotate(kv, group) if step + 1 < n else None  # in flight while we compute
        _note(report, text_bytes + _nbytes(kv) + (_nbytes(kv) if nxt is not None else 0))
        part = kernel(q, kv[0], kv[1], *full, return_stats=True, whole=True)  # the kernel's own lse
        run = part if run is None else merge_partials([run, part])
        kv = comm.wait(nxt) if nxt is not None else None
    out = run[0].to(q.dtype)
    return out[:, :, :vl], (out[:, :, vl:] if q_txt is not None else None)


def gather_kv(q_vis, k_vis, v_vis, q_txt, k_txt, v_txt, valid_text, group, report=None, kernel=FUSED):
    """Joint attention after all-gathering visual K/V (see module docstring)."""
    vl = q_vis.shape[2]
    kv = comm.all_gather(torch.stack([k_vis, v_vis]), 3, group)  # [2, B, H, V, D]
    n_vis = kv.shape[3]
    k, v = _cat(kv[0], k_txt), _cat(kv[1], v_txt)
    del kv  # copied into k/v: release the receive buffer before attention
    _note(report, _nbytes(k, v))
    q = _cat(q_vis, q_txt)
    valid = valid_text if q_txt is not None else None
    out = kernel(q, k, v, *_bounds(valid, n_vis, q), whole=valid is None or kernel.text_valid)
    return out[:, :, :vl], (out[:, :, vl:] if q_txt is not None else None)


# The torch implementation of every mode passes/cp_modes.py declares, by name. "local" (no CP
# group, or keys CP replicates) is gather_kv over a size-1 group: plain bounded attention.
IMPLEMENTATIONS = {"ulysses": ulysses, "ring": ring, "gather_kv": gather_kv, "local": gather_kv}


def joint_attention(mode: str, q_vis, k_vis, v_vis, q_txt, k_txt, v_txt, valid_text, group,
                    report: dict | None = None, kernel=FUSED):
    """Dispatch to one CP mode; with a size-1 group every mode is plain bounded attention."""
    if mode not in IMPLEMENTATIONS:
        raise ValueError(f"unknown joint attention mode {mode!r}; expected one of {tuple(IMPLEMENTATIONS)}")
    return IMPLEMENTATIONS[mode](q_vis, k_vis, v_vis, q_txt, k_txt, v_txt, valid_text, group, report, kernel)


def self_attention(mode: str, q, k, v, group, report: dict | None = None, kernel=FUSED) -> torch.Tensor:
    """Attention of this rank's visual queries over the whole CP-sharded visual sequence (no
    text); mode "local" (no CP group) is plain attention over the local keys."""
    return joint_attention(mode, q, k, v, None, None, None, None, group, report, kernel)[0]
