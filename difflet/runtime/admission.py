"""API-side request validation: a `GenerateRequest`'s fields -> the fields a model process runs.

Runs in the API process, before a request is queued, so a bad request never waits in the queue
and never reaches a model process. Torch-free (the T5/CLIP tokenizers are read with the
`tokenizers` library from ART/host, the same tokenizer.json the host schedule loads).

Invariants:
- Every rejection is a DiffletError whose `where` is the field and whose message starts with it
  (gRPC details read "steps: 0 is outside [1, 1000]"); the service maps it to INVALID_ARGUMENT.
- Prompt policy `truncate` (the default): every text encoder truncates the prompt (and a set
  negative prompt, on true-CFG models) at its compiled max_length, as the family's reference
  pipeline does (right side, special tokens and template positions included); nothing is refused
  for length, since no reference pipeline refuses a long prompt. `admit` returns one
  `Truncation` per encoder that drops tokens (which encoder, tokens kept of how many), counted
  on the host's own tokenizer.json, so the reply can say what the model did not read.
- Prompt policy `strict`: a prompt longer than the longest text encoder's max_length less the
  template positions (special tokens included) is REJECTED naming `prompt` and the limit;
  shorter encoders (FLUX's CLIP) still truncate, and are reported.
- Cache overrides are parsed here with the step-cache package's own parser (syntax and
  ranges); the runner checks what needs the artifacts (a calibration file's ties).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from difflet.errors import DiffletError
from difflet.families import uses_negative_prompt
from difflet.runtime.prompt_text import PromptLengths, Truncation
from difflet.runtime.startup import ArtifactInfo, text_limit
from difflet.runtime.validate import resolve_request

PROMPT_POLICIES = ("truncate", "strict")

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
    """The serving profile's request checks: `admit(**fields)` -> (fields for the model process,
    truncations to report); `check` -> the fields alone."""

    def __init__(self, info: ArtifactInfo, default_cache: str = "off",
                 prompt_policy: str = "truncate") -> None:
        if prompt_policy not in PROMPT_POLICIES:
            raise DiffletError(f"prompt policy {prompt_policy!r} is not one of {PROMPT_POLICIES}",
                               where="--prompt-policy")
        self.profile = info.profile
        self.sizes = info.manifest.sizes
        self.default_cache = default_cache
        self.prompt_policy = prompt_policy
        self.token_limit, self.limit_encoder = text_limit(info.module)
        self.lengths = PromptLengths(info.module, Path(info.root) / info.manifest.host)
        self.negative_reaches_encoders = uses_negative_prompt(info.module)

    def prompt_tokens(self, prompt: str) -> int:
        """Tokens the limiting encoder's tokenizer makes of the bare `prompt`, special tokens included."""
        return len(self.lengths.tokenizer(self.limit_encoder).encode(prompt).ids)

    def truncations(self, prompt: str, negative_prompt: str | None = None) -> list[Truncation]:
        """What each encoder's truncation drops of the prompt (and of a negative prompt the model reads)."""
        cuts = self.lengths.truncations("prompt", prompt)
        if negative_prompt and self.negative_reaches_encoders:
            cuts += self.lengths.truncations("negative_prompt", negative_prompt)
        return cuts

    def check(self, **fields: Any) -> dict[str, Any]:
        """`admit` without the truncation report: the fields for the model process."""
        return self.admit(**fields)[0]

    def admit(self, *, prompt: str, seed: int, steps: int | None, guidance: float | None,
              height: int, width: int, request_id: str, cache: str,
              negative_prompt: str | None = None, frames: int = 0) -> tuple[dict[str, Any], list[Truncation]]:
        """(fields for the model process, truncations to report); raises DiffletError naming the field."""
        params = resolve_request(self.profile, prompt=prompt, seed=seed, steps=steps,
                                 guidance=guidance, height=height, width=width,
                                 request_id=check_request_id(request_id), negative_prompt=negative_prompt,
                                 sizes=self.sizes, frames=frames)
        if self.prompt_policy == "strict" and self.limit_encoder:
            n = self.prompt_tokens(prompt)
            if n > self.token_limit:
                raise _fail("prompt", f"{n} tokens exceeds the text encoder limit of "
                                      f"{self.token_limit} tokens ({self.limit_encoder}); shorten it")
        cuts = self.truncations(prompt, negative_prompt)
        cache = check_cache_mode(cache) if cache.strip() else ""
        fields = {"prompt": params.prompt, "seed": params.seed, "steps": params.steps,
                  "guidance": params.guidance, "height": params.height, "width": params.width,
                  "request_id": params.request_id, "cache": cache or None, "frames": params.frames}
        if negative_prompt is not None:  # only when set: the runner's family picks the default
            fields["negative_prompt"] = negative_prompt
        return fields, cuts
