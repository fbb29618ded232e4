"""Parallel configuration: parse `tp4 | tp2cp2 | tp4+sp | tp2+cfg2 | dp2xtp2 | ...`.

Invariants:
- world = dp * cfg * cp * tp; rank order is tp innermost, then cp, then cfg, then dp:
  rank = ((dp_i * cfg + cfg_i) * cp + cp_i) * tp + tp_i.
- `sp` has no degree: sequence parallelism reuses the tp group.
- `attention` is the CP attention mode (one of passes/cp_modes.py CHOICES) when cp > 1, else "none".
"""
from __future__ import annotations

import re

import msgspec

from difflet.errors import DiffletError
from difflet.ir.nodes import Attrs
from difflet.passes import cp_modes

AXES = ("dp", "cfg", "cp", "tp")          # outermost to innermost
_TERM = re.compile(r"(dp|cfg|cp|tp|sp)(\d*)")


class ParallelConfig(msgspec.Struct, frozen=True):
    tp: int = 1
    cp: int = 1
    cfg: int = 1
    dp: int = 1
    sp: bool = False
    attention: str = "none"

    @property
    def world(self) -> int:
        return self.dp * self.cfg * self.cp * self.tp

    def degree(self, axis: str) -> int:
        return getattr(self, axis)

    def rank(self, dp: int = 0, cfg: int = 0, cp: int = 0, tp: int = 0) -> int:
        return ((dp * self.cfg + cfg) * self.cp + cp) * self.tp + tp

    def coords(self, rank: int) -> dict[str, int]:
        """The inverse of `rank`: this rank's index along every axis."""
        out = {}
        for axis in reversed(AXES):
            out[axis] = rank % self.degree(axis)
            rank //= self.degree(axis)
        return out

    def groups(self, axis: str) -> tuple[tuple[int, ...], ...]:
        """Every group of ranks that differ only along `axis`, in rank order."""
        seen: dict[tuple, list[int]] = {}
        for r in range(self.world):
            c = self.coords(r)
            key = tuple(c[a] for a in AXES if a != axis)
            seen.setdefault(key, []).append(r)
        return tuple(tuple(g) for g in seen.values())

    def name(self) -> str:
        """Canonical spelling: dp2xtp2cp2+cfg2+sp style, stable for cache keys and tables."""
        core = "".join(f"{a}{self.degree(a)}" for a in ("tp", "cp") if self.degree(a) > 1 or a == "tp")
        text = (f"dp{self.dp}x" if self.dp > 1 else "") + core
        if self.cfg > 1:
            text += f"+cfg{self.cfg}"
        if self.sp:
            text += "+sp"
        return text

    def label(self) -> str:
        """`name()` plus the CP attention mode, e.g. `tp2cp2 ulysses`."""
        return self.name() + (f" {self.attention}" if self.cp > 1 else "")

    def to_attrs(self) -> Attrs:
        return Attrs(tp=self.tp, cp=self.cp, cfg=self.cfg, dp=self.dp, sp=self.sp,
                     attention=self.attention, world=self.world)


def parse_parallel(text: str, attention: str | None = None) -> ParallelConfig:
    """Parse a config string; raise DiffletError naming the offending text."""
    src = text.strip().lower()
    if not src:
        raise DiffletError("empty parallel configuration (expected e.g. tp4, tp2cp2, tp4+sp)",
                           where="--parallel")
    degrees: dict[str, int] = {}
    sp = False
    pos = 0
    while pos < len(src):
        if src[pos] in "x+" and pos > 0:
            pos += 1
        m = _TERM.match(src, pos)
        if not m:
            raise DiffletError(f"cannot parse {src[pos:]!r} in parallel configuration {text!r}: "
                               "expected tpN, cpN, cfgN, dpN or sp joined by nothing, 'x' or '+'",
                               where="--parallel", snippet=text)
        axis, digits = m.group(1), m.group(2)
        if axis == "sp":
            if digits:
                raise DiffletError(f"{m.group(0)!r}: sp takes no degree, it reuses the tp group",
                                   where="--parallel", snippet=text)
            if sp:
                raise DiffletError(f"sp given twice in {text!r}", where="--parallel", snippet=text)
            sp = True
        else:
            if not digits:
                raise DiffletError(f"{m.group(0)!r} needs a degree, e.g. {axis}2",
                                   where="--parallel", snippet=text)
            if axis in degrees:
                raise DiffletError(f"{axis} given twice in {text!r}", where="--parallel", snippet=text)
            if int(digits) < 1:
                raise DiffletError(f"{m.group(0)!r}: degree must be >= 1", where="--parallel",
                                   snippet=text)
            degrees[axis] = int(digits)
        pos = m.end()
    cp = degrees.get("cp", 1)
    tp = degrees.get("tp", 1)
    if sp and tp < 2:
        raise DiffletError(f"{text!r}: sp splits tokens across the tp group, so it needs tp >= 2",
                           where="--parallel", snippet=text)
    if attention is not None and attention not in cp_modes.CHOICES:
        raise DiffletError(f"unknown attention mode {attention!r}; expected one of "
                           f"{', '.join(cp_modes.CHOICES)}", where="--attention", snippet=attention)
    if cp == 1 and attention is not None:
        raise DiffletError(f"--attention {attention} selects a context-parallel mode, but "
                           f"{text!r} has no cp > 1", where="--attention", snippet=attention)
    mode = (attention or cp_modes.DEFAULT) if cp > 1 else "none"
    return ParallelConfig(tp=tp, cp=cp, cfg=degrees.get("cfg", 1), dp=degrees.get("dp", 1),
                          sp=sp, attention=mode)


def enumerate_configs(cores: int) -> list[ParallelConfig]:
    """Every configuration whose world is exactly `cores` (for --list-legal), in a stable order."""
    out = []
    for dp in _divisors(cores):
        for cfg in _divisors(cores // dp):
            for cp in _divisors(cores // dp // cfg):
                tp = cores // dp // cfg // cp
                for sp in ((False, True) if tp > 1 else (False,)):
                    for att in (cp_modes.CHOICES if cp > 1 else ("none",)):
                        out.append(ParallelConfig(tp=tp, cp=cp, cfg=cfg, dp=dp, sp=sp, attention=att))
    out.sort(key=lambda c: (c.dp, c.cfg, c.cp, -c.tp, c.sp, cp_modes.CHOICES.index(c.attention)
                            if c.attention in cp_modes.CHOICES else -1))
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
