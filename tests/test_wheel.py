"""The wheel carries what Difflet needs at run time: built from this checkout and installed into a
fresh virtual environment (the libraries from the system's site-packages, not Difflet's source
tree), it imports from the venv, lowers every bundled description with its bundled grammars,
and `difflet demo` serves the bundled trained model.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parent.parent

LOWER_ALL = """
import sys
from pathlib import Path
import difflet
from difflet.bundled import MODELS_DIR
from difflet.frontend.lower import lower_file
from difflet.ir.text import parse_module, print_module

venv = Path(sys.prefix).resolve()
assert Path(difflet.__file__).resolve().is_relative_to(venv), difflet.__file__
names = sorted(p.name for p in MODELS_DIR.glob("*.dsl"))
for name in names:
    module = lower_file(str(MODELS_DIR / name))
    assert parse_module(print_module(module), name) == module, name  # the bundled IR grammar reads it back
print(len(names))
"""


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """A venv (system site-packages for torch & co.) with only the built wheel of Difflet."""
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(root / "dist"), str(REPO)], check=True, capture_output=True)
    (wheel,) = (root / "dist").glob("difflet-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True)
    return venv


def _env() -> dict[str, str]:
    # no PYTHONPATH: nothing of the checkout may be importable from the run's directory
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_the_installed_wheel_lowers_every_bundled_description(wheel_venv, tmp_path):
    proc = subprocess.run([str(wheel_venv / "bin" / "python"), "-c", LOWER_ALL], cwd=tmp_path,
                          capture_output=True, text=True, env=_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) == len(list((REPO / "difflet" / "models").glob("*.dsl")))


@pytest.mark.slow
def test_demo_runs_from_the_installed_wheel(wheel_venv, tmp_path, difflet_test_store):
    proc = subprocess.run([str(wheel_venv / "bin" / "difflet"), "demo", "--store", str(difflet_test_store),
                           "-o", "demo.png"], cwd=tmp_path, capture_output=True, text=True, env=_env(),
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    image = np.asarray(Image.open(io.BytesIO((tmp_path / "demo.png").read_bytes())).convert("RGB"))
    assert image.shape == (32, 32, 3) and image.std() > 0
