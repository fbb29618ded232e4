"""Step-cache mode strings -> `CacheMode`, validated; the one syntax of server flags and requests.

Syntax (the `cache` field of a request, `--cache` of a server):
  off
  cadence:N                       N in [2, 100]: in the cacheable window, one full step then N-1 cached
  online-delta[:ALPHA]            ALPHA in (0, 10], default 0.6
  calibrated:FILE[:THRESHOLD][:step|accumulate]
                                  FILE from `difflet calibrate`; THRESHOLD > 0 overrides the file's;
                                  step/accumulate overrides how estimates meet the threshold
  block[:THRESHOLD]               THRESHOLD in (0, 10], default 0.08; needs an artifact built with
                                  `difflet opt --front-blocks K`: the front runs every step, the rest
                                  only when the front's output changed by >= THRESHOLD (relative L1)
                                  since the rest last ran; else the rest's last residual is reused
  any of these, then options, each at most once:
  +forecast[:ORDER]               ORDER in [0, 2], default 1: a cached step's output (block: the
                                  rest's residual) is forecast from the last ORDER+1 computed ones
  +keep:INITIAL:FINAL             the full steps before and after the cacheable window, each in
                                  [0, 1000] (default 5 and 5; online-delta and calibrated keep >= 2 first)
Invariants:
- Every rejection is a DiffletError whose `where` is the field name given (default "cache") and
  whose message starts with it, like request validation.
- A mode is a runtime setting: nothing here reaches a compiled program or a cache key.
- The initial and final full steps (default 5 and 5) are part of the mode.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from difflet.errors import DiffletError

KINDS = ("off", "cadence", "online-delta", "calibrated", "block")
DEFAULT_ALPHA = 0.6
DEFAULT_BLOCK_THRESHOLD = 0.08  # cache-dit's DBCache default residual-difference threshold
MAX_BLOCK_THRESHOLD = 10.0
DEFAULT_KEEP = (5, 5)
MAX_CADENCE = 100
MAX_ALPHA = 10.0
MAX_FORECAST = 2
MAX_KEEP = 1000
OPTIONS = ("forecast", "keep")


@dataclass(frozen=True)
class CacheMode:
    kind: str = "off"
    cadence: int = 0
    alpha: float = 0.0
    calibration: str = ""          # calibration file path (calibrated)
    threshold: float | None = None  # calibrated: None = the calibration file's; block: its threshold
    accumulate: bool | None = None  # None: the calibration file's
    initial: int = DEFAULT_KEEP[0]
    final: int = DEFAULT_KEEP[1]
    forecast: int | None = None     # None: prev + last delta; else the forecast's order

    @property
    def off(self) -> bool:
        return self.kind == "off"

    def spec(self) -> str:
        """The canonical mode string (parses back to an equal mode)."""
        out = self._decision_spec()
        if self.off:
            return out
        if self.forecast is not None:
            out += f"+forecast:{self.forecast}"
        if (self.initial, self.final) != DEFAULT_KEEP:
            out += f"+keep:{self.initial}:{self.final}"
        return out

    def _decision_spec(self) -> str:
        if self.kind == "cadence":
            return f"cadence:{self.cadence}"
        if self.kind == "online-delta":
            return f"online-delta:{self.alpha:g}"
        if self.kind == "block":
            return f"block:{self.threshold:g}"
        if self.kind == "calibrated":
            parts = [f"calibrated:{self.calibration}"]
            if self.threshold is not None:
                parts.append(f"{self.threshold:g}")
            if self.accumulate is not None:
                parts.append("accumulate" if self.accumulate else "step")
            return ":".join(parts)
        return "off"


def _fail(field: str, message: str) -> DiffletError:
    return DiffletError(f"{field}: {message}", where=field)


def _number(field: str, text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _fail(field, f"{what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise _fail(field, f"{what} {text!r} must be finite")
    return value


def parse_mode(text: str | None, field: str = "cache", initial: int = DEFAULT_KEEP[0],
               final: int = DEFAULT_KEEP[1]) -> CacheMode:
    """Parse and range-check one mode string (None or "" = off)."""
    if initial < 0 or final < 0:
        raise _fail(field, f"initial/final full steps must be >= 0, got {initial}/{final}")
    text = (text or "off").strip()
    text, options = _options(field, text)
    if "keep" in options:
        initial, final = _keep(field, options["keep"])
    mode = _decision(field, text.strip() or "off", initial, final)
    if options and mode.off:
        raise _fail(field, f"+{next(iter(options))} needs a caching decision, as in cadence:3+forecast:1")
    if "forecast" in options:
        mode = replace(mode, forecast=_order(field, options["forecast"] or "1"))
    return mode


def _options(field: str, text: str) -> tuple[str, dict[str, str]]:
    """(the decision, {option: its arguments}) from trailing `+option[:args]` parts (a '+' that
    starts no known option stays in the decision, e.g. in a calibration file's name)."""
    options: dict[str, str] = {}
    while True:
        head, sep, tail = text.rpartition("+")
        name, _, args = tail.partition(":")
        if not sep or name not in OPTIONS:
            return text, options
        if name in options:
            raise _fail(field, f"+{name} is given twice")
        options[name] = args
        text = head


def _keep(field: str, args: str) -> tuple[int, int]:
    parts = args.split(":")
    if len(parts) != 2 or not all(_small_int(p) and int(p) <= MAX_KEEP for p in parts):
        raise _fail(field, f"+keep needs INITIAL:FINAL, two integers in [0, {MAX_KEEP}], as in +keep:2:1, "
                           f"got {args[:40]!r}")
    return int(parts[0]), int(parts[1])


def _decision(field: str, text: str, initial: int, final: int) -> CacheMode:
    kind, _, rest = text.partition(":")
    if kind == "off" and not rest:
        return CacheMode(initial=initial, final=final)
    if kind == "cadence":
        try:
            n = int(rest)
        except ValueError:
            raise _fail(field, f"cadence needs an integer interval, as in cadence:2, got {text!r}") from None
        if not 2 <= n <= MAX_CADENCE:
            raise _fail(field, f"cadence interval {n} is outside [2, {MAX_CADENCE}]")
        return CacheMode("cadence", cadence=n, initial=initial, final=final)
    if kind == "online-delta":
        alpha = DEFAULT_ALPHA if not rest else _number(field, rest, "online-delta alpha")
        if not 0 < alpha <= MAX_ALPHA:
            raise _fail(field, f"online-delta alpha {alpha:g} is outside (0, {MAX_ALPHA:g}]")
        return CacheMode("online-delta", alpha=alpha, initial=max(initial, 2), final=final)
    if kind == "calibrated":
        return _calibrated(field, text, rest, initial, final)
    if kind == "block":
        threshold = DEFAULT_BLOCK_THRESHOLD if not rest else _number(field, rest, "block threshold")
        if not 0 < threshold <= MAX_BLOCK_THRESHOLD:
            raise _fail(field, f"block threshold {threshold:g} is outside (0, {MAX_BLOCK_THRESHOLD:g}]")
        return CacheMode("block", threshold=threshold, initial=initial, final=final)
    raise _fail(field, f"unknown cache mode {text!r}; expected off, cadence:N, online-delta[:ALPHA], "
                       "calibrated:FILE[:THRESHOLD][:step|accumulate] or block[:THRESHOLD], each optionally "
                       "followed by +forecast[:ORDER] and +keep:INITIAL:FINAL")


def _small_int(text: str) -> bool:
    """ASCII digits only, at most 4 (str.isdigit takes '²', which int() refuses)."""
    return 0 < len(text) <= 4 and text.isascii() and text.isdigit()


def _order(field: str, text: str) -> int:
    if not _small_int(text) or int(text) > MAX_FORECAST:
        raise _fail(field, f"forecast order {text[:40]!r} is not one of 0..{MAX_FORECAST}")
    return int(text)


def _calibrated(field: str, text: str, rest: str, initial: int, final: int) -> CacheMode:
    parts = rest.split(":")
    accumulate = None
    if parts and parts[-1] in ("step", "accumulate"):
        accumulate = parts.pop() == "accumulate"
    threshold = None
    if len(parts) >= 2:
        try:
            threshold = float(parts[-1])
        except ValueError:
            threshold = None  # a ':' inside the file name
        else:
            parts.pop()
            if not math.isfinite(threshold) or threshold <= 0:
                raise _fail(field, f"calibrated threshold {threshold:g} must be finite and > 0")
    path = ":".join(parts)
    if not path:
        raise _fail(field, f"calibrated needs a calibration file, as in calibrated:cal.json, got {text!r}")
    # the probe's first score of a request compares with the previous request: never read it
    return CacheMode("calibrated", calibration=path, threshold=threshold, accumulate=accumulate,
                     initial=max(initial, 2), final=final)
