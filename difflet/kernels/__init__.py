"""Attention kernels: the bounded-attention torch reference (the oracle), its fused-SDPA
implementation (what inductor programs call) and, on trn2, NKI's attention_cte; select.py
picks a program's implementation by backend."""
from difflet.kernels.attention_fused import bounded_attention as fused_bounded_attention
from difflet.kernels.attention_ref import bounded_attention, merge_partials

__all__ = ["bounded_attention", "fused_bounded_attention", "merge_partials"]
