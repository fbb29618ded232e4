"""Step caching as the runtime sees it: a resolved per-request plan and the step hooks.

Invariants:
- `CachePlan` is immutable and resolved before the request runs (mode parsed and range-checked,
  calibration file read and checked against the artifact); the denoise loop builds a fresh
  `StepCache` from it for every request, so no caching state crosses requests.
- `StepHooks.before_step` raises `Cancelled` when `should_stop()` is true; `after_step` reports
  (step_index, total_steps, cached). Both are optional and never change what is computed.
- Resolving a mode reads only host files: it compiles and loads nothing.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Callable

from difflet.errors import DiffletError
from difflet.stepcache.calibration import Calibration, calibration_from, check_tied
from difflet.stepcache.calibration_file import read_calibration
from difflet.stepcache.controller import StepCache
from difflet.stepcache.modes import CacheMode, parse_mode


@dataclass(frozen=True)
class CachePlan:
    mode: CacheMode
    calibration: Calibration | None = None
    record: bool = False  # run the probe at every step whatever the mode (calibration runs)

    def controller(self, total: int) -> StepCache:
        cal = self.calibration
        # "off" reads no change, so it measures none unless a calibration run records them
        measure = self.mode.kind != "off" or self.record
        if cal is None:
            return StepCache(self.mode, total, measure=measure)
        return StepCache(self.mode, total, cal.curve, cal.threshold, cal.accumulate, measure=measure)


OFF = CachePlan(CacheMode())


class PlanResolver:
    """Mode strings -> CachePlans for one artifact; calibration files are read once per (path, mtime)."""

    def __init__(self, tie_keys: dict | None, has_probe: bool, names: dict[str, str] | None = None,
                 has_blocks: bool = False) -> None:
        self.tie_keys = tie_keys or {}
        self.has_probe = has_probe
        self.has_blocks = has_blocks
        self.names = dict(names or {})  # a server's --calibration NAME -> file: `calibrated:NAME`
        self._files: dict[tuple[str, float], dict] = {}  # checked file data

    def resolve(self, text: str | None, field: str = "cache") -> CachePlan:
        mode = parse_mode(text, field)
        if mode.kind == "block" and not self.has_blocks:
            raise DiffletError(f"{field}: block caching needs a denoiser built as front and rest programs, and "
                               f"this artifact has none (it serves {self.serves()}); build the artifact from "
                               "`difflet opt --front-blocks K`", where=field)
        if mode.kind != "calibrated":
            return CachePlan(mode)
        if mode.calibration in self.names:
            mode = replace(mode, calibration=self.names[mode.calibration])
        if not self.has_probe:
            raise DiffletError(f"{field}: calibrated caching needs a probe program, and this artifact has "
                               f"none (it serves {self.serves()}); build the artifact "
                               "from `difflet opt --probe separate`", where=field)
        try:
            stamp = os.stat(mode.calibration).st_mtime
        except OSError:
            stamp = -1.0  # load_calibration reports the missing file, naming the field
        key = (mode.calibration, stamp)
        if key not in self._files:
            data = read_calibration(mode.calibration, field)
            check_tied(data, self.tie_keys, field)
            self._files[key] = data
        return CachePlan(mode, calibration_from(self._files[key], mode, field))

    def serves(self) -> str:
        """The modes this artifact serves, as the refusals name them."""
        kinds = ["off", "cadence:N", "online-delta[:ALPHA]"]
        kinds += ["calibrated:FILE"] if self.has_probe else []
        kinds += ["block[:THRESHOLD]"] if self.has_blocks else []
        return ", ".join(kinds[:-1]) + f" and {kinds[-1]}, each with +forecast[:K] and +keep:I:F"


@dataclass(frozen=True)
class StepHooks:
    on_step: Callable[[int, int, bool], object] | None = None
    should_stop: Callable[[], bool] | None = None

    def before_step(self) -> None:
        if self.should_stop is not None and self.should_stop():
            from difflet.runtime.cancel import Cancelled

            raise Cancelled("request cancelled")

    def after_step(self, index: int, total: int, cached: bool) -> None:
        if self.on_step is not None:
            self.on_step(index, total, cached)
