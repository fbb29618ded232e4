"""Where the files Difflet ships inside its package live (a wheel carries them as package data;
the checkout's top-level models/ and grammars/ are links to these folders)."""
from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
MODELS_DIR = PACKAGE / "models"  # model descriptions: real sizes and tiny test variants
GRAMMARS_DIR = PACKAGE / "grammars"  # the DSL's and the textual IR's lark grammars
ASSETS_DIR = PACKAGE / "assets"  # the trained flux-shapes pipeline
