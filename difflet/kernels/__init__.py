"""Attention kernels: the torch reference of the bounded-attention contract (and, on trn2, NKI)."""
from difflet.kernels.attention_ref import bounded_attention, merge_partials

__all__ = ["bounded_attention", "merge_partials"]
