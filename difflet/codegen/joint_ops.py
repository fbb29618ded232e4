"""The joint-sequence attention ops the families' attention processors call (a leaf: it reads
no declaration, so a family module can import it without reaching the registry).

Invariants:
- The joint keys are rearranged [visual, text] so the valid ones, [0, V + valid_text), are one
  interval of the bounded-attention contract (difflet/kernels); queries keep the model's order.
- Softmax is invariant to key order, so with valid_text == T the op equals dense attention.
- Every call goes to `kernel` (difflet/kernels/select.py; the program's backend chose it, default
  the fused SDPA path). Without a valid_text, or at a site that attends its text padding
  (kernel.text_valid), the call is marked whole: every key is valid by construction.
"""
from __future__ import annotations

import torch

from difflet.kernels.select import FUSED, AttentionKernel


def joint_bounded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, text_len: int,
                            valid_text: torch.Tensor | None, text_first: bool = True,
                            kernel: AttentionKernel = FUSED) -> torch.Tensor:
    """Attention over a joint [text, visual] (or [visual, text]) sequence, text keys >= valid_text excluded.

    q/k/v are [B, H, S, D] with S = text_len + V in the model's order; valid_text is a 0-d int64
    tensor in [1, text_len] (None = all text is valid). Returns [B, H, S, D] in query order.
    """
    seq = k.shape[-2]
    if text_first:
        k_text, k_vis = k[..., :text_len, :], k[..., text_len:, :]
        v_text, v_vis = v[..., :text_len, :], v[..., text_len:, :]
    else:
        k_vis, k_text = k[..., : seq - text_len, :], k[..., seq - text_len:, :]
        v_vis, v_text = v[..., : seq - text_len, :], v[..., seq - text_len:, :]
    # [visual, text]: text padding sits after the valid text, so valid keys are [0, V + valid).
    keys = torch.cat([k_vis, k_text], dim=-2)
    values = torch.cat([v_vis, v_text], dim=-2)
    n_vis = seq - text_len
    whole = valid_text is None or kernel.text_valid
    if valid_text is None:
        valid_text = torch.tensor(text_len, dtype=torch.int64, device=q.device)
    lo = torch.zeros((), dtype=torch.int64, device=q.device)
    hi = valid_text.to(device=q.device, dtype=torch.int64).reshape(()) + n_vis
    return kernel(q, keys, values, lo, hi, whole=whole)


def split_joint_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, text_len: int, text_first: bool,
                          valid_text: torch.Tensor | None, mode: str, group,
                          kernel: AttentionKernel = FUSED) -> torch.Tensor:
    """The joint attention of one rank of a split layout: [B, H_local, S, D] q/k/v in the model's
    order (T static text tokens, this rank's visual shard) -> output in query order, the keys
    attended over the CP group in `mode` (difflet.parallel.joint_attention)."""
    from difflet.parallel.joint_attention import joint_attention

    t = text_len
    if valid_text is None:
        valid_text = torch.tensor(t, dtype=torch.int64, device=q.device)
    seq = q.shape[2]
    txt = slice(0, t) if text_first else slice(seq - t, seq)
    vis = slice(t, seq) if text_first else slice(0, seq - t)
    out_vis, out_txt = joint_attention(mode, q[:, :, vis], k[:, :, vis], v[:, :, vis], q[:, :, txt],
                                       k[:, :, txt], v[:, :, txt], valid_text, group, kernel=kernel)
    return torch.cat([out_txt, out_vis] if text_first else [out_vis, out_txt], dim=2)
