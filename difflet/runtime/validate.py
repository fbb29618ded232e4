"""Request validation against the serving profile: raw request fields -> `GenerateParams`.

Invariants:
- Every rejection is a `DiffletError` whose `where` is the offending field name and whose
  message starts with that name (so gRPC details read "height: 64 does not match ...").
- Image size is compiled in: height/width must equal the profile's (0 or None = the default).
- steps and guidance are host values: any steps in [1, 1000], any finite guidance >= 0.
"""
from __future__ import annotations

import math
import uuid
from typing import Any, Mapping

from difflet.errors import DiffletError
from difflet.runtime.schedule import GenerateParams

MAX_STEPS = 1000
MAX_SEED = 2**63 - 1


def _fail(field: str, message: str) -> DiffletError:
    return DiffletError(f"{field}: {message}", where=field)


def _size(field: str, value: int | None, profile: Mapping[str, Any]) -> int:
    expected = int(profile[field])
    if value is None or value == 0:
        return expected
    if value != expected:
        raise _fail(field, f"{value} does not match the serving profile ({expected}); the image "
                           f"size is compiled in, so serve another profile for other sizes")
    return expected


def resolve_request(profile: Mapping[str, Any], *, prompt: str, seed: int, steps: int | None = None,
                    guidance: float | None = None, height: int | None = None,
                    width: int | None = None, request_id: str = "",
                    negative_prompt: str | None = None) -> GenerateParams:
    """Check one request against `profile` and fill defaults; raises DiffletError naming the field."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise _fail("prompt", "must be a non-empty string")
    if not 0 <= int(seed) <= MAX_SEED:
        raise _fail("seed", f"{seed} is outside [0, {MAX_SEED}]")
    steps = int(profile["steps"]) if steps is None else int(steps)
    if not 1 <= steps <= MAX_STEPS:
        raise _fail("steps", f"{steps} is outside [1, {MAX_STEPS}]")
    guidance = float(profile["guidance"]) if guidance is None else float(guidance)
    if not math.isfinite(guidance) or guidance < 0:
        raise _fail("guidance", f"{guidance} must be finite and >= 0")
    if negative_prompt is not None and not isinstance(negative_prompt, str):
        raise _fail("negative_prompt", "must be a string")
    return GenerateParams(
        negative_prompt=negative_prompt, prompt=prompt, seed=int(seed), steps=steps, guidance=guidance,
        height=_size("height", height, profile), width=_size("width", width, profile),
        request_id=request_id or uuid.uuid4().hex[:16],
    )
