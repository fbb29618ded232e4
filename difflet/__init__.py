"""Difflet: a compiler-style serving engine for diffusion transformers."""

__version__ = "0.1.0"
