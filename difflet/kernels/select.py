"""The one kernel-selection point: which bounded-attention implementation a program's attention
sites call, chosen when its program module is built for a backend (codegen/build.py).

Invariants:
- A backend names its implementation in its declaration (`BackendFacts.attention`,
  passes/backend_facts.py); IMPLEMENTATIONS maps that name to the kernel, so no backend name is
  compared here. No backend (None) is the fused SDPA path, what inductor programs have always run.
- The choice is a value handed to each attention processor at install time (no process-wide
  flag): two modules built in one process for different backends keep their own kernels.
- `AttentionKernel.__call__` has the contract's signature (README.md) plus `whole`: the caller
  guarantees the interval is every key. An implementation with an unbounded entry then runs it;
  the fused one has none and computes exactly what it always did (same graph).
- `text_valid`: the site attends its text padding (its declaration has no text mask, as FLUX's),
  so every text key is valid by construction and the joint ops mark their calls whole.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from difflet.kernels import attention_fused, attention_nki


@dataclass(frozen=True)
class AttentionKernel:
    """A bounded-attention implementation (see module invariants)."""

    name: str
    bounded: Callable  # the contract: (q, k, v, lo, hi, return_stats=False, scale=None)
    takes_whole: bool = False  # `bounded` accepts whole=True (runs without bounds)
    text_valid: bool = False

    def __call__(self, q, k, v, lo, hi, return_stats: bool = False, scale: float | None = None,
                 whole: bool = False):
        if whole and self.takes_whole:
            return self.bounded(q, k, v, lo, hi, return_stats=return_stats, scale=scale, whole=True)
        return self.bounded(q, k, v, lo, hi, return_stats=return_stats, scale=scale)

    def for_site(self, text_mask: bool) -> "AttentionKernel":
        """This kernel for a site that does (or, like FLUX's, does not) mask its text padding."""
        return replace(self, text_valid=not text_mask)


def _nki(q, k, v, lo, hi, return_stats=False, scale=None, whole=False):
    # attention_nki.bounded_attention_nki looked up per call, so a test double put on the module runs
    return attention_nki.bounded_attention_nki(q, k, v, lo, hi, return_stats=return_stats, scale=scale, whole=whole)


def _fused(q, k, v, lo, hi, return_stats=False, scale=None):
    return attention_fused.bounded_attention(q, k, v, lo, hi, return_stats=return_stats, scale=scale)


FUSED = AttentionKernel("fused", _fused)
IMPLEMENTATIONS: dict[str, AttentionKernel] = {"fused": FUSED, "nki": AttentionKernel("nki", _nki, takes_whole=True)}


def attention_kernel(backend: str | None) -> AttentionKernel:
    """The implementation `backend` declares (FUSED for None); DiffletError for an unknown backend."""
    if backend is None:
        return FUSED
    from difflet.passes.backend_facts import backend_facts

    return IMPLEMENTATIONS[backend_facts(backend).attention]
