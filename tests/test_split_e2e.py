"""End to end (issue 4): a flux-tiny4 image generated at TP2CP2 Ulysses equals the TP1 image.

Oracle: the same model, weights (one materialized random:0 checkpoint), prompt, seed and steps
through the unsplit TP1 artifacts. Both ARTs are built by `codegen` and loaded by
`ModelRunner.from_artifacts` exactly as a model process does, so this covers lower -> opt ->
codegen (rank programs + presharded weights) -> load (SplitProgram rank workers) -> host schedule
-> PNG. flux-tiny has 2 heads; Ulysses over tp*cp = 4 needs 4, hence flux-tiny4.

Compiled programs go to the shared test store: the first run compiles (the TP1 transformer and
four rank programs, minutes on a shared core), later runs compile nothing (checked below).
"""
from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
from oracle_util import psnr

pytestmark = pytest.mark.slow

FLUX_TINY4 = Path(__file__).resolve().parent.parent / "models" / "flux-tiny4.dsl"
PLANS = {"tp1": ("tp1", None), "tp2cp2": ("tp2cp2", "ulysses")}
REQUEST = dict(prompt="a red cube on a checkered floor", seed=7, steps=4)


def _plan(name: str):
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    parallel, attention = PLANS[name]
    return optimize(lower_file(str(FLUX_TINY4)), parallel=parallel, attention=attention, target="cpu")


@pytest.fixture(scope="module")
def runs(difflet_test_store, tmp_path_factory):
    """Per plan: its module, ART dir, codegen result and the generated PNG (runner closed after)."""
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.driver import codegen
    from difflet.runtime.runner import ModelRunner

    modules = {name: _plan(name) for name in PLANS}
    ckpt = resolve_weights(modules["tp1"], "random:0", difflet_test_store)  # one checkpoint for both
    out = {}
    for name, module in modules.items():
        art = tmp_path_factory.mktemp(f"flux-tiny4-{name}")
        t0 = time.perf_counter()
        made = codegen(module, str(ckpt), art, store=difflet_test_store, log=lambda *_: None)
        t1 = time.perf_counter()
        with ModelRunner.from_artifacts(art) as runner:
            t2 = time.perf_counter()
            # _run also returns the request state: the decoder's float output is compared too
            state, result = runner._run(runner.resolve(**REQUEST))
            t3 = time.perf_counter()
            programs = dict(runner.env.programs)
            workers = [p for prog in programs.values() for p in getattr(prog, "_procs", [])]
        print(f"{name}: codegen {t1 - t0:.1f} s (compiled {made.compiled}), load {t2 - t1:.1f} s, "
              f"generate {t3 - t2:.1f} s")
        out[name] = dict(module=module, ckpt=ckpt, art=art, codegen=made, png=result.png, decoded=state.values["decoded"], programs=programs,
                         workers=workers)
    return out


def _pixels(png: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_tp2cp2_ulysses_image_equals_tp1_image(runs):
    tp1, split = _pixels(runs["tp1"]["png"]), _pixels(runs["tp2cp2"]["png"])
    assert tp1.shape == split.shape == (32, 32, 3)
    assert int(tp1.max()) > int(tp1.min())  # a constant image would make the comparison vacuous
    diff = int(np.abs(tp1.astype(np.int16) - split.astype(np.int16)).max())
    print(f"tp2cp2 ulysses vs tp1: PSNR {psnr(tp1, split):.1f} dB, max abs pixel diff {diff}")
    assert psnr(tp1, split) >= 40.0
    assert diff <= 1  # float32 reorderings only: at most one rounding step of uint8
    err = (runs["tp1"]["decoded"] - runs["tp2cp2"]["decoded"]).abs().max().item()
    print(f"decoder output (float32, 4 denoising steps) max abs diff {err:.2e}")
    assert err <= 1e-3


def test_only_the_denoiser_is_split_and_encoders_compile_once(runs):
    from difflet.parallel.workers import SplitProgram

    programs = runs["tp2cp2"]["programs"]
    assert isinstance(programs["transformer"], SplitProgram) and programs["transformer"].world == 4
    # encoders and the VAE are world-1 (replicated placement): one program each, run in this process
    for name in ("text_encoder", "text_encoder_2", "vae"):
        assert not isinstance(programs[name], SplitProgram)
    manifest = runs["tp2cp2"]["codegen"].manifest.components
    assert [len(manifest[n].ranks) for n in ("text_encoder", "text_encoder_2", "vae")] == [1, 1, 1]


def test_closing_the_runner_stops_every_rank_worker_cleanly(runs):
    workers = runs["tp2cp2"]["workers"]
    assert len(workers) == 4 and runs["tp1"]["workers"] == []
    # exit code 0: each worker left its loop on the stop message (not killed after the join timeout)
    assert [p.exitcode for p in workers] == [0, 0, 0, 0]
    split = runs["tp2cp2"]["programs"]["transformer"]
    with pytest.raises(Exception, match="unusable"):
        split._dispatch()


def test_second_codegen_of_both_plans_compiles_nothing(runs, difflet_test_store, tmp_path):
    from difflet.codegen.driver import codegen

    for name, run in runs.items():
        again = codegen(run["module"], str(run["ckpt"]), tmp_path / name, store=difflet_test_store,
                        log=lambda *_: None)
        assert again.compiled == [], name


def test_rank_workers_end_with_a_process_that_never_closed_its_runner(runs):
    """No close(): the interpreter's exit still ends every rank worker (daemonic workers are
    stopped and joined by multiprocessing at exit), so none is left behind once the process is."""
    import os
    import subprocess
    import sys

    script = ("import sys\nfrom difflet.runtime.runner import ModelRunner\n"
              "r = ModelRunner.from_artifacts(sys.argv[1])\n"
              "print(' '.join(str(p.pid) for p in r.env.programs['transformer']._procs))\n")
    done = subprocess.run([sys.executable, "-c", script, str(runs["tp2cp2"]["art"])], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 4
    assert [p for p in pids if os.path.exists(f"/proc/{p}")] == []
