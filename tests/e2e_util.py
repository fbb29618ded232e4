"""`difflet demo` as a user runs it (a subprocess of the real CLI), shared by the e2e test files."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
from PIL import Image

PROMPT = "a red fox in the snow"
# model -> (frames or 0 for an image, height, width, fps, has sound), from the tiny DSLs' profiles
TINY = {"qwen-image-tiny": (0, 64, 64, 0, False), "wan2.1-tiny": (9, 32, 32, 16, False),
        "hunyuan-video-tiny": (5, 32, 32, 15, False), "ltx2-tiny": (9, 32, 32, 24, True)}


def lossless(model: str) -> tuple[str, ...]:
    return ("--lossless-video",) if TINY.get(model, (0,))[0] else ()


def tp1_demo_runner(tmp_path_factory, store):
    """model -> (CompletedProcess, output path) of ONE `difflet demo PROMPT --model M` run per
    session worker, as a user runs it (cwd a fresh directory, no -o; video models with
    --lossless-video, so MP4 frames are the generated frames)."""
    runs = {}

    def run(model: str):
        if model not in runs:
            cwd = tmp_path_factory.mktemp(f"tp1-{model}")
            proc = subprocess.run([sys.executable, "-m", "difflet.cli", "demo", PROMPT, "--model", model,
                                   "--store", str(store), *lossless(model)],
                                  capture_output=True, text=True, timeout=1800, cwd=cwd)
            assert proc.returncode == 0, proc.stderr[-2000:]
            runs[model] = (proc, cwd / ("demo.mp4" if TINY.get(model, (0,))[0] else "demo.png"))
        return runs[model]

    return run


def pixels(out) -> np.ndarray:
    """A demo's image [H, W, 3], or a video's decoded MP4 frames [F, H, W, 3]."""
    import av

    if out.suffix == ".png":
        return np.asarray(Image.open(out).convert("RGB"))
    with av.open(str(out)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def demo_pixels(tmp_path, store, model: str, *args: str) -> np.ndarray:
    """`difflet demo PROMPT --model M ARGS -o FILE`'s decoded output (a video model's lossless)."""
    video = TINY.get(model, (0,))[0] > 0
    out = tmp_path / f"{model}{'-'.join(args)}.{'mp4' if video else 'png'}"
    proc = subprocess.run([sys.executable, "-m", "difflet.cli", "demo", PROMPT, "--model", model,
                           "--store", str(store), "-o", str(out), *args, *lossless(model)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return pixels(out)


def assert_parallel_serves_the_pipeline_output(tmp_path, store, model: str, args: tuple[str, ...]) -> None:
    """`difflet demo --parallel` compiles split rank programs and serves them through the real
    difflet-runtime; the image (a video: every frame of the lossless MP4) equals the family's
    diffusers pipeline on the same checkpoint, prompt and seed (pipeline_oracle.py) by
    tests/oracle_util.py's closeness rule: split programs reorder float sums only, and a wrong
    shard or head order fails it by far. Lossless video keeps the generated frames' pixels."""
    from oracle_util import assert_images_close
    from pipeline_oracle import pipeline_output

    split = demo_pixels(tmp_path, store, model, *args)
    assert_images_close(split, pipeline_output(model, PROMPT, 42), f"{model} {' '.join(args)} vs the pipeline")
