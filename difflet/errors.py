"""User-facing errors. The CLI prints them as one line and exits 2; never a traceback.

Invariant: every error about an input names the input and where it went wrong: a `Loc`
(file:line:col) for DSL/IR, a field name for requests, a path for files.
"""
from __future__ import annotations


class DiffletError(Exception):
    """A mistake in user input. `where` is a Loc, a path, or a field name; `snippet` the offending text."""

    def __init__(self, message: str, where: object = None, snippet: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.where = where
        self.snippet = snippet

    def __str__(self) -> str:
        head = f"{self.where}: {self.message}" if self.where is not None else self.message
        if self.snippet:
            return f"{head}\n    {self.snippet}"
        return head


class BackendUnavailable(DiffletError):
    """A selected backend whose toolchain is not installed here (e.g. the Neuron SDK)."""
