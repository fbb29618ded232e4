"""`difflet demo` end to end, as a user runs it (a subprocess of the real CLI), twice on one store.

The first run may compile or reuse (the test store is shared); the second must compile nothing,
and both must write the same PNG (same prompt and seed, fresh server each time).
"""
from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

STAGES = ("lower", "opt", "codegen", "load+warm-up", "request")
PROMPT = "a red fox in the snow"


def run_demo(store, out):
    proc = subprocess.run([sys.executable, "-m", "difflet.cli", "demo", "--store", str(store),
                           "-o", str(out)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_demo_runs_end_to_end_and_second_run_reuses_programs(tmp_path, difflet_test_store):
    first = run_demo(difflet_test_store, tmp_path / "a.png")
    second = run_demo(difflet_test_store, tmp_path / "b.png")
    for stage in STAGES:
        assert f"| {stage} |" in first and f"| {stage} |" in second
    assert "compiled 0, reused 4" in second
    png = (tmp_path / "a.png").read_bytes()
    assert png == (tmp_path / "b.png").read_bytes()  # the same stored programs on one machine: exact
    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    assert image.shape == (32, 32, 3) and image.std() > 0


# model -> (frames or 0 for an image, height, width, fps, has sound), from the tiny DSLs' profiles
TINY = {"qwen-image-tiny": (0, 64, 64, 0, False), "wan2.1-tiny": (9, 32, 32, 16, False),
        "hunyuan-video-tiny": (5, 32, 32, 15, False), "ltx2-tiny": (9, 32, 32, 24, True)}


@pytest.fixture(scope="session")
def tp1_demo(tmp_path_factory, difflet_test_store):
    """model -> (CompletedProcess, output path) of ONE `difflet demo PROMPT --model M` run per
    session, as a user runs it (cwd a fresh directory, no -o; video models with --lossless-video,
    so MP4 frames are the generated frames): the every-family test checks it and the --parallel
    test compares with it, so the TP1 server starts once per model."""
    runs = {}

    def run(model: str):
        if model not in runs:
            cwd = tmp_path_factory.mktemp(f"tp1-{model}")
            proc = subprocess.run([sys.executable, "-m", "difflet.cli", "demo", PROMPT, "--model", model,
                                   "--store", str(difflet_test_store), *_lossless(model)],
                                  capture_output=True, text=True, timeout=1800, cwd=cwd)
            assert proc.returncode == 0, proc.stderr[-2000:]
            runs[model] = (proc, cwd / ("demo.mp4" if TINY.get(model, (0,))[0] else "demo.png"))
        return runs[model]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(TINY))
def test_demo_serves_every_tiny_family_over_grpc(tp1_demo, model):
    """The CLI as a user runs it, without -o: a PNG for the image model, an MP4 (AAC track for
    LTX-2) with the profile's frames and rate for the video models, RGB H.264 under --lossless-video."""
    import av

    frames, height, width, fps, sound = TINY[model]
    proc, out = tp1_demo(model)
    assert f"wrote {out.name}" in proc.stdout and "| request |" in proc.stdout
    if not frames:
        image = np.asarray(Image.open(out).convert("RGB"))
        assert image.shape == (height, width, 3) and image.std() > 0
        return
    with av.open(str(out)) as container:
        video = container.streams.video[0]
        decoded = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video)])
        assert float(video.average_rate) == fps and len(container.streams.audio) == int(sound)
        assert video.codec_context.profile == "High 4:4:4 Predictive" and video.codec_context.pix_fmt == "gbrp"
    assert decoded.shape == (frames, height, width, 3) and decoded.std() > 0


def _pixels(out) -> np.ndarray:
    """A demo's image [H, W, 3], or a video's decoded MP4 frames [F, H, W, 3]."""
    import av

    if out.suffix == ".png":
        return np.asarray(Image.open(out).convert("RGB"))
    with av.open(str(out)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _lossless(model: str) -> tuple[str, ...]:
    return ("--lossless-video",) if TINY.get(model, (0,))[0] else ()


def demo_pixels(tmp_path, store, model: str, *args: str) -> np.ndarray:
    """`difflet demo PROMPT --model M ARGS -o FILE`'s decoded output (a video model's lossless)."""
    video = TINY.get(model, (0,))[0] > 0
    out = tmp_path / f"{model}{'-'.join(args)}.{'mp4' if video else 'png'}"
    proc = subprocess.run([sys.executable, "-m", "difflet.cli", "demo", PROMPT, "--model", model,
                           "--store", str(store), "-o", str(out), *args, *_lossless(model)],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return _pixels(out)


@pytest.mark.slow
@pytest.mark.parametrize("model, args", [
    ("flux-tiny4", ("--parallel", "tp2cp2", "--attention", "ulysses")),
    ("qwen-image-tiny", ("--parallel", "tp2")),
    ("qwen-image-tiny", ("--parallel", "tp1cp2", "--attention", "ring")),
    ("wan2.1-tiny", ("--parallel", "tp2")),
    ("wan2.1-tiny", ("--parallel", "tp1cp2", "--attention", "ring")),
    ("hunyuan-video-tiny", ("--parallel", "tp2")),
    ("hunyuan-video-tiny", ("--parallel", "tp1cp2", "--attention", "ulysses")),
    ("ltx2-tiny", ("--parallel", "tp2")),
    ("ltx2-tiny", ("--parallel", "tp1cp2", "--attention", "ring")),  # rank programs shared with test_split_ltx2
])
def test_demo_parallel_serves_the_tp1_output(tmp_path, difflet_test_store, tp1_demo, model, args):
    """`difflet demo --parallel` compiles split rank programs and serves them through the real
    difflet-runtime; the image (a video: every frame of the lossless MP4, >= 60 dB each) equals the
    TP1 demo's (split programs reorder float sums only: tests/oracle_util.py's closeness rule; a
    wrong shard or head order fails it by far). Lossless video keeps a one-level pixel change one
    pixel: H.264 at CRF 12 spreads it over the frames predicted from it."""
    from oracle_util import describe_match, images_close, psnr

    tp1 = _pixels(tp1_demo(model)[1])
    split = demo_pixels(tmp_path, difflet_test_store, model, *args)
    if split.ndim == 4:
        worst = min(psnr(a, b) for a, b in zip(split, tp1))
        print(f"{model} {' '.join(args)}: worst frame {worst:.1f} dB")
        assert split.shape == tp1.shape and worst >= 60
    else:
        assert images_close(split, tp1), describe_match(split, tp1)
