"""Read HLO text (torch_xla's `_get_xla_tensors_hlo`) for what a Neuron graph cannot hold: float64.

Invariants: pure Python, no torch or torch_xla import, so CI tests it on a text sample without the
XLA environment (tests/test_xla_hlo.py). An instruction counts as a float64 op when its *result*
shape holds an f64 or c128 element type (tuple results included); `mentions` counts every f64/c128
shape in the text (operands too), so a clean program has both at 0.
"""
from __future__ import annotations

import re

# Neuron cores have no FP64 unit (shared/notes/trainium.md); c128 is two f64s.
F64_TYPES = ("f64", "c128")
_SHAPE = re.compile(r"\b(f64|c128)\[")
# `[ROOT] [%]name = SHAPE opcode(` ; SHAPE is `ty[dims]{layout}` or a parenthesised tuple of them
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>\(.*?\)|\w+\[[^\]]*\](?:\{[^}]*\})?)"
                    r"\s+(?P<op>[\w\-]+)")
# with XLA_IR_DEBUG=1 XLA_HLO_DEBUG=1 torch_xla names the aten op and Python line that made each instruction
_META = re.compile(r'op_type="(?P<aten>[^"]*)".*?source_file="(?P<file>[^"]*)" source_line=(?P<line>\d+)')


def instructions(hlo: str):
    """(name, result shape, opcode) of every HLO instruction line in `hlo`."""
    for line in hlo.splitlines():
        m = _INSTR.match(line)
        if m:
            yield m.group("name"), m.group("shape"), m.group("op")


def parameters(hlo: str) -> int:
    """How many parameters the ENTRY computation takes (a runtime input folded into a constant or
    merged with another parameter shows up as one fewer); reducers' own parameters come before."""
    entry = hlo.split("\nENTRY", 1)[-1]
    return sum(1 for _, _, op in instructions(entry) if op == "parameter")


def _origin(line: str) -> str:
    m = _META.search(line)
    if not m:
        return ""
    path = m.group("file").split("site-packages/")[-1]
    return f" from {m.group('aten')} ({path}:{m.group('line')})"


def count_f64(hlo: str, examples: int = 5) -> dict:
    """{'ops': instructions with a float64 result, 'mentions': f64/c128 shapes anywhere,
    'opcodes': {opcode: count} of those instructions, 'examples': the first few of them, with
    the aten op and Python line that made each when the HLO carries debug metadata}."""
    ops, opcodes, named = 0, {}, []
    for line in hlo.splitlines():
        m = _INSTR.match(line)
        if not m or not _SHAPE.search(m.group("shape")):
            continue
        ops += 1
        opcodes[m.group("op")] = opcodes.get(m.group("op"), 0) + 1
        if len(named) < examples:
            named.append(f"{m.group('name')} = {m.group('shape')} {m.group('op')}{_origin(line)}")
    return {"ops": ops, "mentions": len(_SHAPE.findall(hlo)), "opcodes": opcodes, "examples": named}
