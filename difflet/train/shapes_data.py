"""Procedural training data for the flux-shapes model: one coloured shape on a plain background.

Invariants:
- every image is `IMAGE_SIZE` x `IMAGE_SIZE` RGB uint8 and shows exactly one shape from `SHAPES`,
  filled with one `COLOURS` entry, on a background of a *different* `COLOURS` entry;
- the caption names exactly what is drawn: ``caption(shape, fg, bg)`` ==
  ``"a {fg} {shape} on a {bg} background"``; `CAPTIONS` lists every (shape, fg, bg) triple once,
  in a fixed order;
- `sample(rng)` draws size and position uniformly from fixed ranges, so a given
  `numpy.random.Generator` seed always yields the same images (training is reproducible);
- the shape lies wholly inside the image with a margin, so its silhouette is never clipped.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IMAGE_SIZE = 32
SHAPES = ("circle", "square", "triangle")
# Colours far apart in RGB (min pairwise distance > 180) so "which colour is this" is a clean
# nearest-neighbour question both for the renderer's anti-aliased edges and for the checker.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 180, 50),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 30),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
}
COLOUR_NAMES = tuple(COLOURS)
# Half-extent of the shape in pixels: big enough (>= 1/4 of the image) that the 4x4-pixel
# transformer tokens see the silhouette, small enough that position can still vary.
HALF_MIN, HALF_MAX = 7, 12
MARGIN = 1
_SUPERSAMPLE = 4  # anti-aliasing: render at 4x and box-filter down


def caption(shape: str, fg: str, bg: str) -> str:
    return f"a {fg} {shape} on a {bg} background"


CAPTIONS: tuple[tuple[str, str, str], ...] = tuple(
    (s, f, b) for s in SHAPES for f in COLOUR_NAMES for b in COLOUR_NAMES if f != b)


@dataclass(frozen=True)
class Spec:
    """What one image shows; (cx, cy) is the shape centre and `half` its half-extent, in pixels."""

    shape: str
    fg: str
    bg: str
    cx: float
    cy: float
    half: float

    @property
    def caption(self) -> str:
        return caption(self.shape, self.fg, self.bg)


def shape_mask(shape: str, cx: float, cy: float, half: float, size: int = IMAGE_SIZE,
               supersample: int = _SUPERSAMPLE, half_y: float | None = None) -> np.ndarray:
    """Coverage in [0, 1] of each pixel by the shape (float32 [size, size]).

    circle: radius `half`; square: axis-aligned, side 2*half; triangle: isosceles, apex up,
    base 2*half wide at cy + half, apex at cy - half. A `half_y` other than `half` stretches
    the shape vertically (ellipse, rectangle, taller/flatter triangle): the checker fits such
    templates to a bounding box; the training data never uses it.
    """
    half_y = half if half_y is None else half_y
    n = size * supersample
    c = (np.arange(n, dtype=np.float32) + 0.5) / supersample  # sub-pixel centres, pixel units
    y, x = np.meshgrid(c, c, indexing="ij")
    dx, dy = x - cx, (y - cy) * (half / half_y)  # in units where the shape is unstretched
    if shape == "circle":
        inside = dx * dx + dy * dy <= half * half
    elif shape == "square":
        inside = (np.abs(dx) <= half) & (np.abs(dy) <= half)
    elif shape == "triangle":
        # the half-width grows linearly from 0 at the apex to `half` at the base
        frac = (dy + half) / (2 * half)
        inside = (frac >= 0) & (frac <= 1) & (np.abs(dx) <= frac * half)
    else:
        raise ValueError(f"unknown shape {shape!r}")
    return inside.reshape(size, supersample, size, supersample).mean(axis=(1, 3)).astype(np.float32)


def render(spec: Spec, size: int = IMAGE_SIZE) -> np.ndarray:
    """The image of `spec` as uint8 [size, size, 3]."""
    cover = shape_mask(spec.shape, spec.cx, spec.cy, spec.half, size)[..., None]
    fg = np.asarray(COLOURS[spec.fg], np.float32)
    bg = np.asarray(COLOURS[spec.bg], np.float32)
    return np.clip(np.rint(cover * fg + (1 - cover) * bg), 0, 255).astype(np.uint8)


def random_spec(rng: np.random.Generator, shape: str | None = None, fg: str | None = None,
                bg: str | None = None) -> Spec:
    """A random spec; fixed fields are kept, the rest drawn uniformly (bg always != fg)."""
    shape = shape or SHAPES[rng.integers(len(SHAPES))]
    fg = fg or COLOUR_NAMES[rng.integers(len(COLOUR_NAMES))]
    if bg is None:
        others = [c for c in COLOUR_NAMES if c != fg]
        bg = others[rng.integers(len(others))]
    half = float(rng.uniform(HALF_MIN, HALF_MAX))
    lo, hi = half + MARGIN, IMAGE_SIZE - half - MARGIN
    cx, cy = float(rng.uniform(lo, hi)), float(rng.uniform(lo, hi))
    return Spec(shape, fg, bg, cx, cy, half)


def sample(rng: np.random.Generator, n: int) -> tuple[np.ndarray, list[Spec]]:
    """`n` random images as uint8 [n, size, size, 3] with their specs."""
    specs = [random_spec(rng) for _ in range(n)]
    return np.stack([render(s) for s in specs]), specs


def to_tensor(images: np.ndarray):
    """uint8 [n, h, w, 3] -> float32 torch [n, 3, h, w] in [-1, 1] (the VAE's input range)."""
    import torch

    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)

