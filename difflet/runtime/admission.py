"""API-side request validation: a request's field values -> the `Request` a model process runs.

Runs in the API process, before a request is queued, so a bad request never waits in the queue
and never reaches a model process. Torch-free (the T5/CLIP tokenizers are read with the
`tokenizers` library from ART/host, the same tokenizer.json the host schedule loads).

Invariants:
- Every rejection is a DiffletError whose `where` is the field and whose message starts with it
  (gRPC details read "steps: 0 is outside [1, 1000]"); the service maps it to INVALID_ARGUMENT.
- Prompt policy `truncate` (the default): every text encoder truncates the prompt (and a set
  negative prompt, on true-CFG models) at its compiled max_length, as the family's reference
  pipeline does (right side, special tokens and template positions included); nothing under the
  schema's MAX_PROMPT_CHARS is refused for length, since no reference pipeline refuses a long
  prompt (that bound is checked before any tokenizer runs). `admit` returns one
  `Truncation` per encoder that drops tokens (which encoder, tokens kept of how many), counted
  on the host's own tokenizer.json, so the reply can say what the model did not read.
- Prompt policy `strict`: a prompt longer than the longest text encoder's max_length less the
  template positions (special tokens included) is REJECTED naming `prompt` and the limit;
  shorter encoders (FLUX's CLIP) still truncate, and are reported.
- Types, ranges, sizes and the cache mode's syntax are validate.resolve_request's (with the
  served sizes), here and nowhere else on the serving path; the runner checks only what needs
  the artifacts (a calibration file's ties).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from difflet.errors import DiffletError
from difflet.families import facts_of, uses_negative_prompt
from difflet.runtime.prompt_text import PromptLengths, Truncation
from difflet.runtime.images import ImageLimits
from difflet.runtime.request import MAX_PROMPT_CHARS, Request
from difflet.runtime.startup import ArtifactInfo, text_limit
from difflet.runtime.image_fields import profile_images
from difflet.runtime.validate import resolve_request

GRPC_DEFAULT_MESSAGE = 4 << 20  # gRPC's own receive bound, enough for any text-only request

PROMPT_POLICIES = ("truncate", "strict")


def _fail(field: str, message: str) -> DiffletError:
    return DiffletError(f"{field}: {message}", where=field)


class Admission:
    """The serving profile's request checks: `admit(**values)` -> (the `Request` for the model
    process, truncations to report); `check` -> the request alone."""

    def __init__(self, info: ArtifactInfo, prompt_policy: str = "truncate",
                 adapters: dict[str, float] | None = None, calibrations: dict[str, str] | None = None,
                 image_bounds: tuple[int, int] = (0, 0)) -> None:
        """`image_bounds`: (bytes, pixels) of one input image; 0 = ImageLimits.for_sizes's."""
        if prompt_policy not in PROMPT_POLICIES:
            raise DiffletError(f"prompt policy {prompt_policy!r} is not one of {PROMPT_POLICIES}",
                               where="--prompt-policy")
        self.profile = info.profile
        self.adapters = dict(adapters or {})  # the loaded LoRA adapters' names -> load scales
        self.calibrations = dict(calibrations or {})  # --calibration names -> files; never a request's path
        self.sizes = info.manifest.sizes
        self.image_limits = ImageLimits.for_sizes(
            [int(w) * int(h) for w, h in (s.split("x")[:2] for s in self.sizes)]
            + [int(self.profile["height"]) * int(self.profile["width"])], *image_bounds)
        images, mask, _ = profile_images(self.profile)
        # the largest request message a front must take: its images at the bound, prompts, the rest
        self.max_message = max(GRPC_DEFAULT_MESSAGE, self.image_limits.max_bytes * (images + mask)
                               + 8 * MAX_PROMPT_CHARS + (64 << 10))
        self.prompt_policy = prompt_policy
        self.token_limit, self.limit_encoder = text_limit(info.module)
        self.lengths = PromptLengths(info.module, Path(info.root) / info.manifest.host)
        self.negative_reaches_encoders = uses_negative_prompt(info.module)
        self.input_sizes = facts_of(info.module).input_sizes

    def prompt_tokens(self, prompt: str) -> int:
        """Tokens the limiting encoder's tokenizer makes of the bare `prompt`, special tokens included."""
        return len(self.lengths.tokenizer(self.limit_encoder).encode(prompt).ids)

    def truncations(self, prompt: str, negative_prompt: str | None = None) -> list[Truncation]:
        """What each encoder's truncation drops of the prompt (and of a negative prompt the model reads)."""
        cuts = self.lengths.truncations("prompt", prompt)
        if negative_prompt and self.negative_reaches_encoders:
            cuts += self.lengths.truncations("negative_prompt", negative_prompt)
        return cuts

    def check(self, **values: Any) -> Request:
        """`admit` without the truncation report: the request for the model process."""
        return self.admit(**values)[0]

    def admit(self, **values: Any) -> tuple[Request, list[Truncation]]:
        """(the resolved request, truncations to report) of field values (None = not given);
        raises DiffletError naming the field."""
        request = resolve_request(self.profile, self.sizes, self.adapters, self.calibrations,
                                  image_limits=self.image_limits, input_sizes=self.input_sizes, **values)
        if self.prompt_policy == "strict" and self.limit_encoder:
            n = self.prompt_tokens(request.prompt)
            if n > self.token_limit:
                raise _fail("prompt", f"{n} tokens exceeds the text encoder limit of "
                                      f"{self.token_limit} tokens ({self.limit_encoder}); shorten it")
        return request, self.truncations(request.prompt, request.negative_prompt)
