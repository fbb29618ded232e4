"""FLUX's card: both encoders read the bare prompt; embedded guidance (one pass); images."""
from __future__ import annotations

from difflet.runtime.cards import FamilyCard

CARD = FamilyCard(default_guidance="embedded")
