"""What a host step works on: the per-server `HostEnv` and the per-request `RequestState`.

Invariants:
- `HostEnv` holds only what is the same for every request (module, programs, host assets such as
  tokenizers); `RequestState` is created fresh for each request and dropped after it, so no
  sampling state (generator, scheduler, latents) ever crosses requests.
- A leaf of the runtime: the families' host steps import it, and it imports no family.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from difflet.errors import DiffletError
from difflet.ir.nodes import Module, Node, Op
from difflet.runtime.host import PHASES
from difflet.runtime.request import Request


@dataclass(frozen=True)
class GenerateParams:
    """One validated request as the host steps read it: `params.prompt`, `params.steps`, ... are
    the resolved `request.Request`'s fields (no "use the default" markers left; negative_prompt
    None = the family's default); `cache` is its step-cache plan (None = off)."""

    request: Request
    cache: Any = None  # a stepcache.plan.CachePlan

    def __getattr__(self, name: str) -> Any:  # only for names not found above: the request's fields
        if name == "request":  # not set yet (copy/unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.request, name)


@dataclass
class RequestState:
    """Everything one request creates: intermediate tensors by name, the output, timings (ms).

    A decode step sets exactly one of `image` (uint8 [H, W, 3]) or `video` (uint8 [F, H, W, 3]
    with `fps`); a model with sound also sets `audio` (float32 [channels, samples] in [-1, 1])
    and `sample_rate`.
    """

    params: GenerateParams
    values: dict[str, Any] = field(default_factory=dict)
    image: Any = None  # uint8 numpy array [H, W, 3] once an image decode step ran
    video: Any = None  # uint8 numpy array [F, H, W, 3] once a video decode step ran
    fps: float = 0.0
    audio: Any = None  # float32 numpy array [channels, samples], or None
    sample_rate: int = 0
    timings: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in PHASES})


class HostEnv:
    """The per-server side of the host schedule: IR module, programs, cached host assets."""

    def __init__(self, module: Module, programs: Mapping[str, Callable], host_dir: Path | str,
                 assets: dict[str, Any] | None = None) -> None:
        self.module = module
        self.programs = dict(programs)
        self.host_dir = Path(host_dir)
        self.profile = module.attrs["profile"]
        self._assets: dict[str, Any] = assets if assets is not None else {}  # shared across sizes
        self.gate = None  # a batching.BatchGate when this size has batched programs
        self._locks = self.asset("program-locks", dict)  # id(program) -> Lock, shared across sizes
        self._casts: dict[str, dict] = {}  # component -> invoke's reuse memo, used under its lock
        for prog in self.programs.values():
            self._locks.setdefault(id(prog), threading.Lock())

    def component(self, name: str) -> Node:
        return self.module.component(name)

    def invoke(self, component: str, **values: Any) -> dict[str, Any]:
        from difflet.runtime.invoke import invoke

        if self.gate is not None and self.gate.batched(component):
            return self.gate.call(component, values)
        program = self.programs[component]
        # a program set after construction (a test's call-counting wrapper) gets its lock here
        with self._locks.setdefault(id(program), threading.Lock()):
            return invoke(self.component(component), program, values, self._casts.setdefault(component, {}))

    def asset(self, key: str, load: Callable[[], Any]) -> Any:
        """A host asset loaded once per server (tokenizers); must be read-only afterwards."""
        if key not in self._assets:
            self._assets[key] = load()
        return self._assets[key]

    def tokenizer(self, component: Node, prepare: Callable[[Any], Any] | None = None) -> tuple[Any, int]:
        """(tokenizer, max_length) of an encoder's `tokenizer` attrs: AutoTokenizer from the
        artifact's host/ folder (a real checkpoint's or a tiny one), loaded once per server;
        `prepare(tok)` adjusts it once after loading (e.g. a pipeline's forced padding side)."""
        spec = component.attrs.get("tokenizer")
        if spec is None:
            raise DiffletError(f"text encoder {component.name!r} declares no tokenizer", where=component.loc)

        def load():
            from transformers import AutoTokenizer

            path = self.host_dir / spec["subfolder"]
            if not path.is_dir():
                raise DiffletError("tokenizer directory missing from the artifacts", where=str(path))
            tok = AutoTokenizer.from_pretrained(str(path))
            return tok if prepare is None else prepare(tok)

        return self.asset(f"tokenizer:{component.name}", load), int(spec["max_length"])

    def runtime_default(self, name: str) -> int:
        """The IR default of a module-level runtime value (e.g. FLUX's valid_text)."""
        nodes = self.module.find(Op.RUNTIME, name)
        if not nodes:
            raise DiffletError(f"the module declares no runtime value {name!r}", where="module")
        return int(nodes[0].attrs["default"])
