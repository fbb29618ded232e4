"""The IR's text form: `print_module(m) -> str` and `parse_module(text, filename) -> Module`.

Invariant: `parse_module(print_module(m)) == m` for every Module (printer.py, parser.py).
"""
from __future__ import annotations

from difflet.ir.parser import parse_module
from difflet.ir.printer import format_header, print_module

__all__ = ["print_module", "parse_module", "format_header"]
