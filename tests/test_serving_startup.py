"""difflet-runtime refuses artifacts that do not match the serving profile, with the reason, as
one "error:" line and exit code 2 (no traceback, never "listening on"). Each case edits a private
copy of the flux-tiny artifacts; only the corrupted-weights case gets as far as a model process
(the others are refused by the API process's torch-free checks before any spawn).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from serving_util import copy_art, corrupt


def run_server(art, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "difflet.runtime.server", "--artifacts", str(art),
                           "--port", "0", *args], capture_output=True, text=True, timeout=600)


def refused(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "listening on" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


@pytest.fixture
def art(flux_tiny_art, tmp_path):
    return copy_art(flux_tiny_art, tmp_path / "art")


def edit_manifest(art, change) -> None:
    path = art / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def test_corrupted_weight_file_stops_startup(art):
    corrupt(art / "weights" / "transformer.rank0.safetensors")
    line = refused(run_server(art))
    assert "model process 0" in line and "weights of 'transformer'" in line and "corrupt" in line
    assert "transformer.rank0.safetensors" in line


def test_manifest_of_another_profile_stops_startup(art):
    def other_profile(m):
        m["profile"].update(height=64, width=64)
        m["model"] = "flux_tiny_64"

    edit_manifest(art, other_profile)
    line = refused(run_server(art))
    assert "manifest.json belongs to another profile than module.ir" in line
    assert "model: manifest 'flux_tiny_64' vs module.ir 'flux_tiny'" in line
    assert "profile height: 64 vs 32" in line and "profile width: 64 vs 32" in line


def test_rank_assignment_is_checked(art):
    def swap(m):
        m["components"]["transformer"]["ranks"][0]["program"]["path"] = "programs/transformer.rank1.pt2"

    edit_manifest(art, swap)
    line = refused(run_server(art))
    assert "component 'transformer': rank 0's program file 'programs/transformer.rank1.pt2' " \
           "is assigned to another rank" in line


def test_serving_profile_option_must_match(flux_tiny_art):
    line = refused(run_server(flux_tiny_art, "--profile", "height=64", "--profile", "model=flux_tiny"))
    assert "do not match the serving profile: height=64 (compiled for height=32)" in line
    line = refused(run_server(flux_tiny_art, "--profile", "height"))
    assert "--profile" in line and "KEY=VALUE" in line


@pytest.mark.parametrize("mode,message", [
    ("sometimes", "--cache: unknown cache mode 'sometimes'"),
    ("online-delta:-1", "--cache: online-delta alpha -1 is outside"),
])
def test_bad_cache_mode_stops_startup(flux_tiny_art, mode, message):
    assert message in refused(run_server(flux_tiny_art, "--cache", mode))


@pytest.mark.parametrize("spec,message", [
    ("wan", "'wan' is not NAME=FILE"),
    ("a b=x.json", "calibration name 'a b'"),
    ("z=/dev/zero", "/dev/zero: not a file of at most 16 MiB"),  # a device is never read
    ("p=/etc/passwd", "'/etc/passwd' is not JSON"),
    ("c=CAL", "is given twice"),
])
def test_bad_calibration_stops_startup(flux_tiny_art, tmp_path, spec, message):
    """--calibration is the operator's: its syntax and each file's format are checked before any
    model process starts (a request can only name what is configured here)."""
    cal = tmp_path / "cal.json"
    cal.write_text('{"format": "difflet-stepcache-calibration", "version": 1}')  # what read_calibration checks
    args = ["--calibration", spec.replace("CAL", str(cal))]
    if spec.startswith("c="):
        args += ["--calibration", f"c={cal}"]
    assert message in refused(run_server(flux_tiny_art, *args))
