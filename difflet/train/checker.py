"""Prompt-following checker: which background colour, shape colour and shape an image shows.

Plain image analysis, no learned parts, so it can judge a model without sharing its mistakes:
1. background = the palette colour most border pixels are nearest to (the shape never touches
   the border in the training data, and the border is most of what a sample gets right first);
2. foreground colour = the palette colour (other than the background) most of the clearly
   non-background pixels are nearest to;
3. foreground mask = pixels nearer the foreground colour than the background colour, reduced to
   its largest 4-connected component (a stray speck must not stretch the bounding box);
4. shape = the template (circle, square, apex-up triangle) fitted to the mask's bounding box
   that has the highest IoU with the mask. Templates are stretched to the box's aspect ratio
   (ellipse, rectangle, stretched triangle): the checker asks which of the three shape
   *classes* is drawn, so a slightly oblong square still counts as a square; on the training
   data (aspect 1) this is the same as unstretched templates.

Invariant: `analyze` never raises on a valid uint8 [H, W, 3] image; when there is no usable
foreground it returns fg=None and shape=None, which never match a caption.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from difflet.train.shapes_data import COLOUR_NAMES, COLOURS, SHAPES, shape_mask

_PALETTE = np.asarray([COLOURS[c] for c in COLOUR_NAMES], np.float32)
# A pixel counts as "clearly not background" beyond this RGB distance; half the smallest
# distance between two palette colours, so an anti-aliased edge pixel is not counted twice.
_FAR = 0.5 * min(float(np.linalg.norm(a - b)) for i, a in enumerate(_PALETTE) for b in _PALETTE[i + 1:])
_MIN_PIXELS = 12  # below this a "shape" is noise: the smallest training shape covers ~150 px


@dataclass(frozen=True)
class Verdict:
    bg: str
    fg: str | None
    shape: str | None
    scores: dict  # template IoU per shape (empty when there is no foreground)


def _nearest(pixels: np.ndarray) -> np.ndarray:
    """Palette index nearest to each pixel of float [..., 3]."""
    d = ((pixels[..., None, :] - _PALETTE) ** 2).sum(-1)
    return d.argmin(-1)


def _largest_component(mask: np.ndarray) -> np.ndarray:
    seen = np.zeros_like(mask, bool)
    best: list[tuple[int, int]] = []
    h, w = mask.shape
    for sy, sx in zip(*np.nonzero(mask)):
        if seen[sy, sx]:
            continue
        comp, queue = [], deque([(sy, sx)])
        seen[sy, sx] = True
        while queue:
            y, x = queue.popleft()
            comp.append((y, x))
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        if len(comp) > len(best):
            best = comp
    out = np.zeros_like(mask, bool)
    if best:
        ys, xs = zip(*best)
        out[list(ys), list(xs)] = True
    return out


def classify_shape(mask: np.ndarray) -> tuple[str | None, dict]:
    """Best-IoU template for a boolean mask, with every template's IoU."""
    ys, xs = np.nonzero(mask)
    if len(ys) < _MIN_PIXELS:
        return None, {}
    # the bounding box in pixel-edge coordinates; templates are drawn to fill it exactly
    x0, x1, y0, y1 = xs.min(), xs.max() + 1, ys.min(), ys.max() + 1
    cx, cy, hx, hy = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2, (y1 - y0) / 2
    scores = {}
    for shape in SHAPES:
        tmpl = shape_mask(shape, cx, cy, hx, size=mask.shape[0], half_y=hy) >= 0.5
        inter = np.logical_and(tmpl, mask).sum()
        union = np.logical_or(tmpl, mask).sum()
        scores[shape] = float(inter / max(union, 1))
    return max(scores, key=scores.get), scores


def analyze(image: np.ndarray) -> Verdict:
    """Judge one uint8 [H, W, 3] image (square)."""
    img = np.asarray(image, np.float32)[..., :3]
    border = np.concatenate([img[0], img[-1], img[1:-1, 0], img[1:-1, -1]])
    bg_i = int(np.bincount(_nearest(border), minlength=len(_PALETTE)).argmax())
    bg = COLOUR_NAMES[bg_i]
    far = np.linalg.norm(img - _PALETTE[bg_i], axis=-1) > _FAR
    cls = _nearest(img)
    votes = np.bincount(cls[far], minlength=len(_PALETTE))
    votes[bg_i] = 0
    if votes.sum() < _MIN_PIXELS:
        return Verdict(bg, None, None, {})
    fg_i = int(votes.argmax())
    d_fg = np.linalg.norm(img - _PALETTE[fg_i], axis=-1)
    d_bg = np.linalg.norm(img - _PALETTE[bg_i], axis=-1)
    mask = _largest_component(d_fg < d_bg)
    shape, scores = classify_shape(mask)
    return Verdict(bg, COLOUR_NAMES[fg_i], shape, scores)


def check(image: np.ndarray, shape: str, fg: str, bg: str) -> dict[str, bool]:
    """Per-attribute hits of `image` against the caption's (shape, fg, bg)."""
    v = analyze(image)
    return {"fg": v.fg == fg, "bg": v.bg == bg, "shape": v.shape == shape}
