"""The shipped flux-shapes weights draw what the prompt asks, judged by an image-analysis checker.

Oracles: the checker is validated against the procedural renderer's ground truth (the spec each
image was drawn from); the model is then judged by that checker through the stock diffusers
FluxPipeline at its default step count. The same judgement must reject a random transformer,
so a passing model test means trained weights, not a lenient checker.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from difflet.train import ASSET_DIR, TRANSFORMER_CONFIG, generate, load_pipeline
from difflet.train import shapes_data as D
from difflet.train.checker import analyze, check

# Every shape and every colour, as foreground and as background, at least once.
PROMPTS = [("circle", "red", "blue"), ("square", "yellow", "black"), ("triangle", "white", "green"),
           ("circle", "green", "white"), ("square", "blue", "red"), ("triangle", "black", "yellow")]
SEEDS = [0, 1]


def _scores(pipe) -> dict[str, int]:
    jobs = [(p, s) for p in PROMPTS for s in SEEDS]
    images = generate(pipe, [D.caption(*p) for p, _ in jobs], [s for _, s in jobs])
    hits = {"fg": 0, "bg": 0, "shape": 0}
    for (p, _), img in zip(jobs, images):
        for k, v in check(img, *p).items():
            hits[k] += v
    return hits


def _follows(hits: dict[str, int]) -> bool:
    """The bar for "follows prompts" on these 12 images (the bench measures the full grid)."""
    n = len(PROMPTS) * len(SEEDS)
    return hits["bg"] >= n - 1 and hits["fg"] >= n - 1 and hits["shape"] >= n - 3


@pytest.fixture(scope="module")
def pipe():
    torch.set_num_threads(1)
    if not (ASSET_DIR / "model_index.json").is_file():
        pytest.skip("difflet/assets/flux-shapes not present")
    return load_pipeline()


def test_checker_matches_ground_truth():
    rng = np.random.default_rng(2024)
    images, specs = D.sample(rng, 600)
    wrong = [(s, analyze(im)) for im, s in zip(images, specs)
             if (lambda v: (v.shape, v.fg, v.bg) != (s.shape, s.fg, s.bg))(analyze(im))]
    assert len(wrong) <= 3, wrong[:3]


@pytest.mark.parametrize("w,h", [(20, 20), (22, 14), (14, 22)])
def test_checker_names_shapes_drawn_by_an_independent_renderer(w, h):
    """PIL's rasteriser, not the training renderer: squares/circles/triangles, also oblong."""
    from PIL import Image, ImageDraw

    x0, y0 = 16 - w // 2, 16 - h // 2
    box = (x0, y0, x0 + w - 1, y0 + h - 1)
    for shape, fg, bg in [("square", "red", "white"), ("circle", "blue", "yellow"),
                          ("triangle", "black", "green")]:
        im = Image.new("RGB", (32, 32), D.COLOURS[bg])
        draw = ImageDraw.Draw(im)
        if shape == "square":
            draw.rectangle(box, fill=D.COLOURS[fg])
        elif shape == "circle":
            draw.ellipse(box, fill=D.COLOURS[fg])
        else:
            draw.polygon([(16, y0), (x0, y0 + h - 1), (x0 + w - 1, y0 + h - 1)], fill=D.COLOURS[fg])
        assert check(np.asarray(im), shape, fg, bg) == {"fg": True, "bg": True, "shape": True}, (shape, w, h)


def test_checker_rejects_wrong_captions_and_blank_images():
    spec = D.Spec("triangle", "red", "blue", 16.0, 16.0, 10.0)
    img = D.render(spec)
    assert check(img, "triangle", "red", "blue") == {"fg": True, "bg": True, "shape": True}
    assert check(img, "circle", "blue", "red") == {"fg": False, "bg": False, "shape": False}
    blank = np.full((32, 32, 3), D.COLOURS["green"], np.uint8)
    v = analyze(blank)
    assert (v.bg, v.fg, v.shape) == ("green", None, None)
    noise = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    analyze(noise)  # never raises


def test_shipped_model_follows_prompts(pipe):
    hits = _scores(pipe)
    assert _follows(hits), hits


def test_random_transformer_fails_the_same_bar(pipe):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    trained = pipe.transformer
    pipe.transformer = FluxTransformer2DModel(**TRANSFORMER_CONFIG).eval()
    try:
        hits = _scores(pipe)
    finally:
        pipe.transformer = trained
    assert not _follows(hits), hits
