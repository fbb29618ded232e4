"""Wan 2.1's card: WanPipeline's prompt_clean, cfg guidance, 16 fps."""
from __future__ import annotations

import html

from difflet.runtime.cards import FamilyCard

FPS = 16.0  # the fps WanPipeline's examples export at (export_to_video(..., fps=16))


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


CARD = FamilyCard(prompt_text=lambda prompt, templated: prompt_clean(prompt), default_guidance="cfg",
                  fps=lambda module: FPS)
