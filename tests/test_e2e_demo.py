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
    assert png == (tmp_path / "b.png").read_bytes()
    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    assert image.shape == (32, 32, 3) and image.std() > 0
