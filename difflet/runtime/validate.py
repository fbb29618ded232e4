"""Request validation against the serving profile: raw request fields -> `GenerateParams`.

Invariants:
- Every rejection is a `DiffletError` whose `where` is the offending field name and whose
  message starts with that name (so gRPC details read "height: 64 does not match ...").
- Image size is compiled in: height/width must be the profile's (0 or None = the default) or,
  for an artifact with shape buckets, one of its served sizes ("WxH"; a video's frame count
  stays the profile's).
- steps and guidance are host values: any steps in [1, 1000], any finite guidance >= 0.
"""
from __future__ import annotations

import math
import uuid
from typing import Any, Mapping, Sequence

from difflet.errors import DiffletError
from difflet.runtime.host.env import GenerateParams

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


def _bucket_size(height: int | None, width: int | None, frames: int | None, profile: Mapping[str, Any],
                 sizes: Sequence[str]) -> tuple[int, int, int]:
    """(height, width, frames) of a request to a bucketed artifact: 0/None takes the default's."""
    h = int(height or profile["height"])
    w = int(width or profile["width"])
    served = [tuple(int(x) for x in s.split("x")) for s in sizes]
    if (w, h) not in {s[:2] for s in served}:
        field = "width" if w not in {s[0] for s in served} else "height"
        raise _fail(field, f"{w}x{h} (width x height) is not a served size; served: {', '.join(sizes)}")
    if "frames" not in profile:
        return h, w, 0
    f = int(frames or profile["frames"])
    if (w, h, f) not in served:
        counts = ", ".join(str(s[2]) for s in served if s[:2] == (w, h))
        raise _fail("frames", f"{f} frames are not served at {w}x{h} (served: {counts})")
    return h, w, f


def _frames(frames: int | None, profile: Mapping[str, Any]) -> int:
    if "frames" not in profile:
        if frames:
            raise _fail("frames", f"{frames}: this model makes images, not videos")
        return 0
    expected = int(profile["frames"])
    if frames and frames != expected:
        raise _fail("frames", f"{frames} does not match the serving profile ({expected}); the frame "
                              "count is compiled in, so serve another profile (or shape buckets) for others")
    return expected


def resolve_request(profile: Mapping[str, Any], *, prompt: str, seed: int, steps: int | None = None,
                    guidance: float | None = None, height: int | None = None,
                    width: int | None = None, request_id: str = "",
                    negative_prompt: str | None = None, sizes: Sequence[str] = (),
                    frames: int | None = None) -> GenerateParams:
    """Check one request against `profile` (and the served `sizes` of a bucketed artifact) and
    fill defaults; raises DiffletError naming the field."""
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
    if len(sizes) > 1:
        height, width, frames = _bucket_size(height, width, frames, profile, sizes)
    else:
        height, width = _size("height", height, profile), _size("width", width, profile)
        frames = _frames(frames, profile)
    return GenerateParams(
        negative_prompt=negative_prompt, prompt=prompt, seed=int(seed), steps=steps, guidance=guidance,
        height=height, width=width, request_id=request_id or uuid.uuid4().hex[:16], frames=frames,
    )
