"""API-side request validation: a `GenerateRequest`'s fields -> the fields a model process runs.

Runs in the API process, before a request is queued, so a bad request never waits in the queue
and never reaches a model process. Torch-free (the T5/CLIP tokenizers are read with the
`tokenizers` library from ART/host, the same tokenizer.json the host schedule loads).

Invariants:
- Every rejection is a DiffletError whose `where` is the field and whose message starts with it
  (gRPC details read "steps: 0 is outside [1, 1000]"); the service maps it to INVALID_ARGUMENT.
- Prompt policy: a prompt longer than the longest text encoder's compiled max_length (special
  tokens included) is REJECTED naming the limit, never silently truncated; shorter encoders
  (FLUX's CLIP) truncate as the reference pipeline does.
- Cache overrides are parsed here with the step-cache package's own parser (syntax and
  ranges); the runner checks what needs the artifacts (a calibration file's ties).
"""
from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

from difflet.errors import DiffletError
from difflet.runtime.startup import ArtifactInfo, text_limit
from difflet.runtime.validate import resolve_request

MAX_REQUEST_ID = 128
CACHE_SYNTAX = "off | cadence:N | online-delta:ALPHA | calibrated:FILE[:THRESHOLD]"


def _fail(field: str, message: str) -> DiffletError:
    return DiffletError(f"{field}: {message}", where=field)


def _positive(text: str, kind, field: str, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise _fail(field, f"{what} {text!r} is not a number (expected {CACHE_SYNTAX})") from None
    if not (math.isfinite(value) and value > 0):
        raise _fail(field, f"{what} {text!r} must be finite and > 0")
    return value


def check_cache_mode(mode: str, field: str = "cache") -> str:
    """The syntax and ranges of a cache mode string; returns it stripped. The step-cache
    package's own parser decides (so the API process and the runner never disagree); the
    fallback below only serves a build without it."""
    mode = mode.strip()
    try:
        from difflet.stepcache.modes import parse_mode
    except ImportError:
        return _check_cache_syntax(mode, field)
    parse_mode(mode, field)
    return mode


def _check_cache_syntax(mode: str, field: str) -> str:
    kind, _, rest = mode.partition(":")
    if mode == "off":
        return mode
    if kind == "cadence" and rest:
        _positive(rest, int, field, "cadence")
    elif kind == "online-delta" and rest:
        _positive(rest, float, field, "alpha")
    elif kind == "calibrated" and rest:
        path, _, threshold = rest.rpartition(":")
        if path and threshold:
            _positive(threshold, float, field, "threshold")
    else:
        raise _fail(field, f"{mode!r} is not a cache mode ({CACHE_SYNTAX})")
    return mode


def check_request_id(request_id: str) -> str:
    if len(request_id) > MAX_REQUEST_ID:
        raise _fail("request_id", f"is {len(request_id)} characters, at most {MAX_REQUEST_ID}")
    if request_id and not (request_id.isascii() and request_id.isprintable()):
        raise _fail("request_id", "must be printable ASCII")
    return request_id


class Admission:
    """The serving profile's request checks; `check(**fields)` -> fields for the model process."""

    def __init__(self, info: ArtifactInfo, default_cache: str = "off",
                 cache_available: bool = True) -> None:
        self.profile = info.profile
        self.default_cache = default_cache
        self.cache_available = cache_available
        self.token_limit, self.limit_encoder = text_limit(info.module)
        self._tokenizer_dir = None
        if self.limit_encoder:
            spec = info.module.component(self.limit_encoder).attrs["tokenizer"]
            self._tokenizer_dir = Path(info.root) / info.manifest.host / spec["subfolder"]
        self._tokenizer = None
        self._lock = threading.Lock()

    def prompt_tokens(self, prompt: str) -> int:
        """Tokens the limiting encoder's tokenizer makes of `prompt`, special tokens included."""
        with self._lock:
            if self._tokenizer is None:
                from tokenizers import Tokenizer

                self._tokenizer = Tokenizer.from_file(str(self._tokenizer_dir / "tokenizer.json"))
            return len(self._tokenizer.encode(prompt).ids)

    def check(self, *, prompt: str, seed: int, steps: int | None, guidance: float | None,
              height: int, width: int, request_id: str, cache: str,
              negative_prompt: str | None = None) -> dict[str, Any]:
        params = resolve_request(self.profile, prompt=prompt, seed=seed, steps=steps,
                                 guidance=guidance, height=height, width=width,
                                 request_id=check_request_id(request_id), negative_prompt=negative_prompt)
        if self._tokenizer_dir is not None:
            n = self.prompt_tokens(prompt)
            if n > self.token_limit:
                raise _fail("prompt", f"{n} tokens exceeds the text encoder limit of "
                                      f"{self.token_limit} tokens ({self.limit_encoder}); shorten it")
        cache = check_cache_mode(cache) if cache.strip() else ""
        if cache and cache != "off" and not self.cache_available:
            raise _fail("cache", f"{cache!r}: this server's runner has no step caching")
        fields = {"prompt": params.prompt, "seed": params.seed, "steps": params.steps,
                  "guidance": params.guidance, "height": params.height, "width": params.width,
                  "request_id": params.request_id, "cache": cache or None}
        if negative_prompt is not None:  # only when set: the runner's family picks the default
            fields["negative_prompt"] = negative_prompt
        return fields
