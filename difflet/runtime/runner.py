"""The model runner: loads one serving profile's programs once, runs the host schedule per request.

Invariants:
- Independent of gRPC (a later issue moves it into its own process): it takes and returns
  plain Python values and raises DiffletError for bad requests.
- Requests run one at a time (a lock); each gets fresh `RequestState` via `run_schedule`.
- `warm_up()` must pass (finite, right shape, not constant) before a server reports SERVING.
"""
from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from difflet.errors import DiffletError
from difflet.ir.nodes import Module
from difflet.runtime.schedule import GenerateParams, HostEnv, check_schedule, run_schedule
from difflet.runtime.validate import resolve_request

WARM_UP_PROMPT = "a warm-up image of a lighthouse at dusk"


@dataclass(frozen=True)
class GenerateResult:
    params: GenerateParams
    image: Any  # uint8 numpy array [H, W, 3]
    png: bytes
    timings: dict[str, float]  # encode/denoise/decode/total, milliseconds


def encode_png(image) -> bytes:
    """Deterministic PNG bytes of a uint8 [H, W, 3] array (no timestamps, fixed compression)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image, mode="RGB").save(buf, format="PNG", compress_level=6)
    return buf.getvalue()


class ModelRunner:
    """Programs + host schedule of one module; `generate` is thread-safe and serialised."""

    def __init__(self, module: Module, programs: Mapping[str, Callable], host_dir: Path | str,
                 manifest: Mapping[str, Any] | None = None) -> None:
        check_schedule(module, programs)
        self.env = HostEnv(module, programs, host_dir)
        self.manifest = dict(manifest or {})
        self._lock = threading.Lock()

    @classmethod
    def from_artifacts(cls, root: Path | str, verify: bool = True) -> "ModelRunner":
        from difflet.codegen.artifacts import load_artifacts

        root = Path(root)
        if not root.is_dir():
            raise DiffletError("artifact directory does not exist", where=str(root))
        art = load_artifacts(root, verify=verify)
        return cls(art.module, art.programs, art.host_dir, art.manifest)

    @property
    def module(self) -> Module:
        return self.env.module

    @property
    def profile(self) -> dict[str, Any]:
        return self.env.profile.to_python()

    def resolve(self, **fields: Any) -> GenerateParams:
        return resolve_request(self.env.profile, **fields)

    def generate(self, params: GenerateParams) -> GenerateResult:
        return self._run(params)[1]

    def _run(self, params: GenerateParams):
        with self._lock:
            start = time.perf_counter()
            state = run_schedule(self.env, params)
            png = encode_png(state.image)
            timings = dict(state.timings, total=(time.perf_counter() - start) * 1000.0)
        return state, GenerateResult(params, state.image, png, timings)

    def warm_up(self) -> GenerateResult:
        """One real generation at the profile defaults, checked; raises RuntimeError if bad."""
        import torch

        state, result = self._run(self.resolve(prompt=WARM_UP_PROMPT, seed=0, request_id="warm-up"))
        decoded = state.values.get("decoded")
        h, w = int(self.env.profile["height"]), int(self.env.profile["width"])
        problems = []
        if decoded is not None and not bool(torch.isfinite(decoded).all()):
            problems.append("decoder output is not finite")
        if result.image.shape != (h, w, 3):
            problems.append(f"image shape {result.image.shape} != {(h, w, 3)}")
        elif int(result.image.max()) == int(result.image.min()):
            problems.append(f"image is constant ({int(result.image.min())})")
        if problems:
            raise RuntimeError("warm-up generation failed its checks: " + "; ".join(problems))
        return result
