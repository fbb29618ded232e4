"""What each text encoder of a module tokenizes for a prompt, and what its truncation drops.

Torch-free: the API process counts tokens with the `tokenizers` library from the same
tokenizer.json the host schedule loads (ART/host/<subfolder>), so admission knows before a request
is queued what the host steps will cut.

Invariants:
- An encoder's input is its family facts' `prompt_text` (families/<family>/facts.py): the exact string the
  host step hands the tokenizer (the reference pipeline's prompt template, prompt_clean or
  strip); the host steps take it from the same facts.
- Every encoder truncates on the right at its tokenizer's max_length, special tokens included
  (what `truncation=True` does in every reference pipeline), so the positions lost are
  tokens(full text) - max_length; template positions count like any other.
- Counting never truncates or pads: tokenizer.json's own truncation/padding settings are cleared.
- A tokenizer folder without tokenizer.json (FLUX.1-dev's CLIP ships only vocab.json and
  merges.txt) is converted once, at construction, by `transformers` in a child process (the
  fast tokenizer the host's AutoTokenizer builds from the same files), so the API process
  itself never imports transformers or torch.
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from difflet.errors import DiffletError
from difflet.families import facts_of


@dataclass(frozen=True)
class Truncation:
    """One encoder's cut of one prompt field: `tokens` the full input would take, `limit` kept."""
    field: str     # "prompt" | "negative_prompt"
    encoder: str   # the component name (e.g. text_encoder)
    tokens: int
    limit: int

    @property
    def dropped(self) -> int:
        return self.tokens - self.limit

    def describe(self) -> str:
        return (f"{self.field}: {self.encoder} kept {self.limit} of {self.tokens} tokens "
                f"({self.dropped} dropped)")


@dataclass(frozen=True)
class EncoderInput:
    name: str
    tokenizer_dir: Path
    max_length: int
    format: Callable[[str], str]


_CONVERT = ("import sys; from transformers import AutoTokenizer; "
            "sys.stdout.write(AutoTokenizer.from_pretrained(sys.argv[1]).backend_tokenizer.to_str())")


def tokenizer_json(folder: Path) -> str:
    """The folder's tokenizer.json text, converted from its other files when it has none."""
    path = folder / "tokenizer.json"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    if not folder.is_dir():
        raise DiffletError("tokenizer directory missing from the artifacts", where=str(folder))
    done = subprocess.run([sys.executable, "-c", _CONVERT, str(folder)], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0 or not done.stdout.startswith("{"):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise DiffletError(f"tokenizer has no tokenizer.json and transformers cannot build one: {last}",
                           where=str(folder))
    return done.stdout


def _counting_tokenizer(text: str):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(text)
    tok.no_truncation()
    tok.no_padding()
    return tok


class PromptLengths:
    """Per-encoder token counts of a prompt as the host tokenizes it; tokenizers load at construction."""

    def __init__(self, module, host_dir: Path) -> None:
        facts = facts_of(module)
        templated = facts.templated(module)
        self.encoders: list[EncoderInput] = []
        for comp in module.components("encoder"):
            spec = comp.attrs.get("tokenizer")
            if spec is None:
                continue
            fmt = (lambda p, t=comp.name in templated: facts.prompt_text(p, t))
            self.encoders.append(EncoderInput(comp.name, Path(host_dir) / spec["subfolder"],
                                              int(spec["max_length"]), fmt))
        self._tokenizers = {e.name: _counting_tokenizer(tokenizer_json(e.tokenizer_dir))
                            for e in self.encoders}  # at startup: a broken folder fails there

    def tokenizer(self, encoder: str):
        """The encoder's tokenizers.Tokenizer (truncation and padding off; encode is thread-safe)."""
        return self._tokenizers[encoder]

    def count(self, encoder: EncoderInput, prompt: str) -> int:
        """Tokens of the encoder's full input for `prompt` (template and special tokens included)."""
        return len(self.tokenizer(encoder.name).encode(encoder.format(prompt)).ids)

    def truncations(self, field: str, prompt: str) -> list[Truncation]:
        """Every encoder whose truncation drops tokens of `prompt`, in module order."""
        out = []
        for enc in self.encoders:
            n = self.count(enc, prompt)
            if n > enc.max_length:
                out.append(Truncation(field, enc.name, n, enc.max_length))
        return out
