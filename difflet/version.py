"""The Difflet version (a leaf, so modules read it without importing the package's lazy exports)."""

__version__ = "0.1.0"
