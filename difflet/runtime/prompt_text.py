"""What each text encoder of a module tokenizes for a prompt, and what its truncation drops.

Torch-free: the API process counts tokens with the `tokenizers` library from the same
tokenizer.json the host schedule loads (ART/host/<subfolder>), so admission knows before a request
is queued what the host steps will cut.

Invariants:
- `encoder_text(family, role, prompt)` is the exact string the host step hands the tokenizer
  (the reference pipeline's prompt template, prompt_clean or strip); the host steps and this
  module share these functions or (for templates defined by torch-importing modules) a copy a
  test holds equal to the original.
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

import html
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from difflet.errors import DiffletError

# QwenImagePipeline.prompt_template_encode (copy of codegen/family/qwen_image.PROMPT_TEMPLATE,
# which imports torch; tests/test_prompt_policy.py holds them equal)
QWEN_PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")
# HunyuanVideoPipeline's DEFAULT_PROMPT_TEMPLATE["template"] (diffusers imports torch; the test
# holds this copy equal to it)
HUNYUAN_PROMPT_TEMPLATE = (
    "<|start_header_id|>system<|end_header_id|>\n\nDescribe the video by detailing the following "
    "aspects: 1. The main content and theme of the video.2. The color, shape, size, texture, "
    "quantity, text, and spatial relationships of the objects.3. Actions, events, behaviors "
    "temporal relationships, physical movement changes of the objects.4. background environment, "
    "light, style and atmosphere.5. camera angles, movements, and transitions used in the video:"
    "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>")


def prompt_clean(text: str) -> str:
    """WanPipeline's prompt_clean: basic_clean (ftfy if installed, html unescape x2, strip),
    then whitespace runs -> one space, strip."""
    import regex

    try:
        import ftfy
    except ImportError:  # the pipeline skips ftfy when it is not installed, and so do we
        ftfy = None
    if ftfy is not None:
        text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return regex.sub(r"\s+", " ", text).strip()


def encoder_text(family: str, templated: bool, prompt: str) -> str:
    """The string a family's host step tokenizes; `templated`: the encoder that reads the
    prompt inside the pipeline's template (Qwen-Image's encoder, HunyuanVideo's Llama)."""
    if family == "wan":
        return prompt_clean(prompt)
    if family == "ltx2":
        return prompt.strip()
    if templated and family == "qwen_image":
        return QWEN_PROMPT_TEMPLATE.format(prompt)
    if templated and family == "hunyuan_video":
        return HUNYUAN_PROMPT_TEMPLATE.format(prompt)
    return prompt


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


def _encode_step(module, name: str):
    for sched in _schedules(module):
        for step in sched.body:
            if str(step.name) == name:
                return step
    return None


def _schedules(module):
    from difflet.ir.nodes import Op

    return module.find(Op.SCHEDULE)


def _templated(module, family: str) -> set[str]:
    """Encoders that read the prompt inside a template: Qwen-Image's one encoder, the first
    encoder of HunyuanVideo's encode step (its Llama; the CLIP reads the bare prompt)."""
    if family == "qwen_image":
        return {c.name for c in module.components("encoder")}
    step = _encode_step(module, "hunyuan_video.encode_prompt") if family == "hunyuan_video" else None
    return {str(step.args[0])} if step is not None and step.args else set()


def uses_negative_prompt(module) -> bool:
    """Whether a set negative prompt reaches the encoders: true-CFG families (HunyuanVideo only
    under its "true_cfg" guidance mode); FLUX ignores it."""
    family = str(module.attrs.get("family", ""))
    if family in ("qwen_image", "wan", "ltx2"):
        return True
    if family != "hunyuan_video":
        return False
    for sched in _schedules(module):
        for step in sched.body:
            spec = step.attrs.get("guidance") if str(step.name) == "hunyuan_video.denoise" else None
            if spec is not None:
                spec = spec.to_python() if hasattr(spec, "to_python") else spec
                return spec.get("mode") == "true_cfg"
    return False


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
        family = str(module.attrs.get("family", ""))
        templated = _templated(module, family)
        self.encoders: list[EncoderInput] = []
        for comp in module.components("encoder"):
            spec = comp.attrs.get("tokenizer")
            if spec is None:
                continue
            fmt = (lambda p, t=comp.name in templated: encoder_text(family, t, p))
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
