"""`difflet demo` end to end, as a user runs it (a subprocess of the real CLI), twice on one store.

The first run may compile or reuse (the test store is shared); the second must compile nothing,
and both must write the same PNG (same prompt and seed, fresh server each time). Every tiny family
through the demo's TP1 path; the --parallel layouts are in test_e2e_parallel_{images,videos}.py
(separate files, so pytest-xdist runs them beside this one).
"""
from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from e2e_util import TINY

STAGES = ("lower", "opt", "codegen", "load+warm-up", "request")


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
