"""The Python API from a plain script, as diffusers' examples are written (no main guard), on an empty
program store (issue 28, item 5); its own file, so pytest-xdist runs its compiles beside test_python_api.py."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from oracle_util import assert_images_close
from test_python_api import CALL, SIZE, _checkpoint, _reference

pytestmark = pytest.mark.slow  # compiles four programs into an empty store


def test_a_plain_script_without_a_main_guard_compiles_on_an_empty_store(tmp_path):
    """The Python API from a script written as diffusers' examples are (no `if __name__ ==
    "__main__":`), on an empty store with two compile workers: the workers must not run the script
    again (they did: 'the compile worker ... died (BrokenProcessPool)'). Its image equals FluxPipeline's."""
    fine_tune = _checkpoint("flux.dsl", guidance_embeds=True)
    script = tmp_path / "make_image.py"
    script.write_text(
        "import torch\n"
        "from difflet import DiffletPipeline\n"
        f"pipe = DiffletPipeline.from_pretrained({str(fine_tune)!r}, model='flux', dtype=torch.float32,\n"
        f"                                       store={str(tmp_path / 'store')!r}, log=print, **{SIZE!r})\n"
        f"pipe(guidance_scale=2.5, **{CALL!r}).images[0].save({str(tmp_path / 'out.png')!r})\n"
        "pipe.close()\n"
        "print('done')\n")
    env = {**os.environ, "DIFFLET_COMPILE_WORKERS": "2"}
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0 and r.stdout.count("done") == 1, r.stdout + r.stderr
    assert "compiled 4, reused 0" in r.stdout, r.stdout  # all four through the pool
    ours = np.asarray(Image.open(tmp_path / "out.png").convert("RGB"))
    assert_images_close(ours, _reference(fine_tune, guidance_scale=2.5, **CALL), "plain script vs FluxPipeline")


def test_a_plain_script_starting_rank_processes_runs_once(tmp_path):
    """Split programs start gloo ranks from a forkserver, which hands each child `__main__` to
    import: a plain script ran again in every rank, which started ranks of its own and never
    reported. The script starts two ranks of a Difflet-importable function (run_ranks:
    operator.mul(rank, world) on each; parallel/workers.py starts its ranks under the same
    main_not_inherited) and must print its line once."""
    script = tmp_path / "ranks.py"
    script.write_text(
        "import operator\n"
        "from difflet.parallel.launch import run_ranks\n"
        "print('result', run_ranks(operator.mul, 2, timeout=60))\n")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["result [0, 2]"], r.stdout  # once, with rank * world from each rank
