"""The model runner: loads one serving profile's programs once, runs the host schedule per request.

Invariants:
- Independent of gRPC: it runs in the model process (model_process.py) and in the Python API's
  own process (pipeline.py); it takes and returns plain Python values and raises DiffletError
  for bad requests.
- `resolve(**values)` validates a request against the served sizes (validate.resolve_request);
  `admitted(request)` takes one the API process already validated and only resolves its cache
  plan, so nothing is checked twice. `generate` takes either's result as is.
- At most `max_batch` requests run at once (default 1: one at a time), each on its caller's
  thread with fresh `RequestState` via `run_schedule`; with batch buckets their denoiser calls
  of one size meet in that size's BatchGate (runtime/batching.py) and run as batched calls.
- `warm_up()` must pass (finite, right shape, not constant) before a server reports SERVING.
- Step caching: the server default mode (`cache=`) and a request's override (its `cache`)
  are resolved into an immutable `CachePlan` before the request runs; the loop builds fresh
  caching state from it per request. `stats` reports denoiser_calls and cached_steps.
- `generate(on_step=, should_stop=)`: on_step(step_index, total_steps, cached) after every
  denoising step; should_stop() before every schedule step and denoising step (raises
  difflet.runtime.cancel.Cancelled; the next request starts from fresh state all the same).
- Shape buckets: one HostEnv per served size (its single-size module and programs; the
  size-independent programs and the host assets are shared objects); a request runs in the env
  of its size, and `warm_up()` checks every size and every compiled batch size.
- LoRA (`load_loras`): a request runs under its `lora` adapter's weights, swapped into the same
  programs (never compiled); requests of different adapters never run at once (lora.LoraSwitch).
- `close()` (also `with ModelRunner...`) closes every program that has a `.close()` (a split
  program's rank workers stop); idempotent; a split program is unusable afterwards. Without it
  the workers still end with the process (daemonic, and SplitProgram closes itself on GC).
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from difflet.codegen.manifest import Manifest
from difflet.errors import DiffletError
from difflet.families import facts_of
from difflet.ir.nodes import Module
from difflet.runtime.images import warm_up_inputs
from difflet.runtime.media import encode_output
from difflet.runtime.host.env import GenerateParams, HostEnv
from difflet.runtime.request import Request
from difflet.runtime.schedule import check_schedule, run_schedule
from difflet.runtime.validate import resolve_request
from difflet.stepcache.plan import PlanResolver, StepHooks

WARM_UP_PROMPT = "a warm-up image of a lighthouse at dusk"


@dataclass(frozen=True)
class GenerateResult:
    params: GenerateParams
    image: Any  # uint8 numpy array [H, W, 3], or None for a video
    png: bytes  # the PNG of `image`; b"" for a video
    timings: dict[str, float]  # encode/denoise/decode/total, milliseconds
    stats: dict = field(default_factory=dict)  # denoiser_calls, cached_steps, schedule, mode, ...
    video: Any = None  # uint8 numpy array [F, H, W, 3], or None for an image
    mp4: bytes = b""  # the MP4 of `video` (with the audio track, if any)
    fps: float = 0.0

    @property
    def media(self) -> tuple[bytes, str]:
        """(bytes, "png" | "mp4") of the output."""
        return (self.png, "png") if self.video is None else (self.mp4, "mp4")


def tie_keys(module: Module, manifest: Manifest | None) -> dict:
    """What a calibration file is tied to: probe and denoiser cache keys, denoiser weights
    (rank 0's file: a split denoiser's calibration is tied to its first shard)."""
    probes = [n for n in module.body if n.op.value == "probe"]
    den = module.components("denoiser")
    entry = manifest.components.get(den[0].name) if manifest is not None and den else None
    return {"probe_cache_key": probes[0].attrs.get("cache_key") if probes else None,
            "denoiser_cache_key": den[0].attrs.get("cache_key") if den else None,
            "denoiser_weights_sha256": entry.ranks[0].weights.sha256 if entry is not None else None}


class ModelRunner:
    """Programs + host schedule of one module; `generate` is thread-safe and serialised."""

    def __init__(self, module: Module, programs: Mapping[str, Callable], host_dir: Path | str,
                 manifest: Manifest | None = None, probe: Callable | None = None,
                 cache: str | None = "off", sizes: list | None = None, max_batch: int = 1,
                 lossless_video: bool = False, calibrations: dict[str, str] | None = None) -> None:
        """`sizes`: (size, single-size module, programs) per bucket (Artifacts.sizes());
        None = `module` and `programs` are the one size. `max_batch`: requests run at once.
        `calibrations`: a server's --calibration NAME -> file, which `calibrated:NAME` reads."""
        from difflet.ir.buckets import batch_of, size_of, unbatched

        assets: dict[str, Any] = {}
        self.envs: dict[str, HostEnv] = {}
        batched: dict[str, list[HostEnv]] = {}
        for size, view, progs in sizes or [(size_of(module.attrs["profile"]), module, programs)]:
            if batch_of(size) != 1:
                batched.setdefault(unbatched(size), []).append(HostEnv(view, progs, host_dir, assets))
                continue
            check_schedule(view, progs)
            self.envs[size] = HostEnv(view, progs, host_dir, assets)
        for size, extra in batched.items():
            self.envs[size].gate = _gate(self.envs[size], extra)
        self.env = next(iter(self.envs.values()))  # the default size
        self.max_batch = max(1, int(max_batch))
        self.lossless_video = lossless_video  # MP4s decode to the generated frames exactly
        self.manifest = manifest
        self.probe = probe
        self.env.asset("stepcache:probe", lambda: probe)  # per server; its state never read across requests
        blocks = self.manifest is not None and any(c.parts for c in self.manifest.components.values())
        self._plans = PlanResolver(tie_keys(module, self.manifest), probe is not None, calibrations,
                                   has_blocks=blocks)
        self.default_cache = self._plans.resolve(cache)
        self._slots = threading.BoundedSemaphore(self.max_batch)
        self.lora = None  # a LoraSwitch once `load_loras` ran

    def load_loras(self, specs) -> None:
        """Read LoRA adapters ((name, path, scale) each) for this runner's programs, beside those
        already loaded: requests name them in `lora`; nothing is compiled (difflet/runtime/lora.py)."""
        from difflet.runtime.lora import LoraSwitch, read_adapter

        loaded = list(self.lora.adapters.values()) if self.lora is not None else []
        names = [a.name for a in loaded] + [name for name, _, _ in specs]
        if len(set(names)) != len(names):
            raise DiffletError(f"adapter name {next(n for n in names if names.count(n) > 1)!r} is given twice",
                               where="--lora")
        adapters = loaded + [read_adapter(name, path, self.module, scale) for name, path, scale in specs]
        if self.lora is not None:
            self.lora.restore()  # an eager program's checkpoint values are read back from its module
        programs = {id(p): (n, p) for env in self.envs.values() for n, p in env.programs.items()}
        probe = (str(self.probe.node.attrs.get("source", "")), self.probe) if self.probe is not None else None
        self.lora = LoraSwitch(adapters, list(programs.values()), probe) if adapters else None

    @property
    def adapters(self) -> dict[str, float]:
        """The loaded LoRA adapters' names -> their load scales."""
        return {} if self.lora is None else {n: a.default_scale for n, a in self.lora.adapters.items()}

    @classmethod
    def from_artifacts(cls, root: Path | str, verify: bool = True, cache: str | None = "off",
                       max_batch: int = 1, lossless_video: bool = False,
                       calibrations: dict[str, str] | None = None) -> "ModelRunner":
        from difflet.codegen.artifacts import load_artifacts

        root = Path(root)
        if not root.is_dir():
            raise DiffletError("artifact directory does not exist", where=str(root))
        art = load_artifacts(root, verify=verify)  # every program, the probe (role "probe") included
        return cls(art.module, art.programs, art.host_dir, art.manifest, probe=art.probe, cache=cache,
                   sizes=art.sizes(), max_batch=max_batch, lossless_video=lossless_video,
                   calibrations=calibrations)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The compiled batch sizes (1 first)."""
        gate = self.env.gate
        return (1,) if gate is None else tuple(sorted({b for v in gate.variants.values() for b in v}))

    @property
    def module(self) -> Module:
        return self.env.module

    @property
    def profile(self) -> dict[str, Any]:
        return self.env.profile.to_python()

    def resolve(self, **values: Any) -> GenerateParams:
        """Validate a request's field values (None = not given; `cache` unset = the server's
        default mode) against the served sizes; errors name the field."""
        return self.admitted(resolve_request(self.env.profile, tuple(self.envs), self.adapters,
                                             input_sizes=facts_of(self.module).input_sizes, **values))

    def admitted(self, request: Request) -> GenerateParams:
        """A request already validated against these served sizes, with its step-cache plan
        (a calibration file's ties are checked here: errors name `cache`)."""
        plan = self._plans.resolve(request.cache, "cache") if request.cache else self.default_cache
        return GenerateParams(request, plan)

    def generate(self, params: GenerateParams, on_step: Callable[[int, int, bool], Any] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> GenerateResult:
        return self._run(params, StepHooks(on_step, should_stop))[1]

    def _run(self, params: GenerateParams, hooks: StepHooks = StepHooks()):
        if params.cache is None:
            params = replace(params, cache=self.default_cache)
        env = self._env_of(params)
        adapter = self.lora.serving(params.request.lora) if self.lora is not None else contextlib.nullcontext()
        with self._slots, adapter:
            start = time.perf_counter()
            try:
                state = run_schedule(env, params, hooks)
            finally:
                rows = env.gate.take_max_rows() if env.gate is not None else 1
            data, kind = encode_output(state.image, state.video, state.fps, state.audio, state.sample_rate,
                                       self.lossless_video)
            timings = dict(state.timings, total=(time.perf_counter() - start) * 1000.0)
        stats = dict(state.values.get("cache_stats", {}), batch_rows=rows)
        png, mp4 = (data, b"") if kind == "png" else (b"", data)
        return state, GenerateResult(params, state.image, png, timings, stats, state.video, mp4, state.fps)

    def _env_of(self, params: GenerateParams) -> HostEnv:
        """The env of a resolved request's size (resolve/admission checked that it is served)."""
        if len(self.envs) == 1:
            return self.env
        from difflet.ir.buckets import size_of

        return self.envs[size_of({**self.env.profile.to_python(), "height": params.height,
                                  "width": params.width, **({"frames": params.frames} if params.frames else {})})]

    def close(self) -> None:
        """Stop what the programs hold outside this process (split programs' rank workers)."""
        for _ in range(self.max_batch):  # never under a running request: its ranks would be killed mid-call
            self._slots.acquire()
        try:
            progs = {id(p): p for env in self.envs.values() for p in env.programs.values()}
            for prog in (*progs.values(), self.probe):
                if hasattr(prog, "close"):
                    prog.close()
        finally:
            for _ in range(self.max_batch):
                self._slots.release()

    def __enter__(self) -> "ModelRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def warm_up(self) -> GenerateResult:
        """One real generation per served size at the profile defaults, each checked; raises
        RuntimeError if bad. Returns the default size's result."""
        results = [self._warm_up(env) for env in reversed(self.envs.values())]
        for env in self.envs.values():
            if env.gate is not None:
                _warm_up_batches(env)
        return results[-1]

    def _warm_up(self, env: HostEnv) -> GenerateResult:
        if env.gate is not None:
            env.gate.record = {}  # the warm-up's last call per batched component, for its batches
        import torch

        h, w = int(env.profile["height"]), int(env.profile["width"])
        state, result = self._run(self.resolve(prompt=WARM_UP_PROMPT, seed=0, request_id="warm-up",
                                               height=h, width=w, frames=env.profile.get("frames"),
                                               **warm_up_inputs(env.profile, w, h)))
        decoded = state.values.get("decoded")
        problems = []
        if decoded is not None and not bool(torch.isfinite(decoded).all()):
            problems.append("decoder output is not finite")
        out, want = (result.image, (h, w, 3)) if result.video is None else \
            (result.video, (int(env.profile["frames"]), h, w, 3))
        if out.shape != want:
            problems.append(f"output shape {out.shape} != {want}")
        elif bool((out == out[(0,) * (out.ndim - 1)]).all()):  # every pixel one colour (flat red too, not only grey)
            problems.append(f"output is constant (every pixel is {tuple(out[(0,) * (out.ndim - 1)].tolist())})")
        if problems:
            raise RuntimeError(f"warm-up generation ({w}x{h}) failed its checks: " + "; ".join(problems))
        return result


def _gate(env: HostEnv, extra: list[HostEnv]):
    """The BatchGate of size env `env` over its batch-bucket envs: the components whose program
    differs at another batch size, with every compiled batch size."""
    from difflet.ir.buckets import size_of
    from difflet.runtime.batching import BatchGate, Variant

    variants: dict[str, dict[int, Variant]] = {}
    for other in extra:
        batch = int(other.profile["batch"])
        for name, prog in other.programs.items():
            if prog is not env.programs[name]:
                per = variants.setdefault(name, {1: Variant(env.component(name), env.programs[name],
                                                             env._locks[id(env.programs[name])])})
                per[batch] = Variant(other.component(name), prog, other._locks[id(prog)])
    if not variants:
        raise DiffletError(f"batch buckets of size {size_of(env.profile)} change no program", where="manifest.json")
    return BatchGate(variants)


def _warm_up_batches(env: HostEnv) -> None:
    """Each batched program once, on the warm-up's own last call repeated over its rows: every row
    must be finite (raises RuntimeError otherwise)."""
    import torch

    gate = env.gate
    for name, per in gate.variants.items():
        values = gate.record.get(name)
        if values is None:
            raise RuntimeError(f"warm-up: the schedule never called batched component {name!r}")
        for batch in sorted(b for b in per if b != 1):
            rows = gate.run_rows(name, [values] * batch)
            if not all(bool(torch.isfinite(t).all()) for r in rows for t in r.values() if t.is_floating_point()):
                raise RuntimeError(f"warm-up: {name} at batch size {batch} gave non-finite output")
    gate.record = None
