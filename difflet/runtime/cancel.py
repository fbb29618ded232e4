"""Cooperative cancellation of one generation.

Invariant: `Cancelled` is raised only at a step boundary (when the runner's `should_stop()` says
so), so a cancelled generation leaves no half-updated state in the model process: the next
request starts from fresh sampling and caching state like any other.
"""
from __future__ import annotations


class Cancelled(Exception):
    """The generation was stopped at a step boundary because `should_stop()` returned True."""
