"""Helpers the oracle tests share: PSNR of uint8 images, and a tiny model compiled into an ART."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two uint8 arrays (inf when identical)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def planned_tiny(dsl: Path | str):
    """A tiny description lowered and optimized as the tests serve it (tp1, cpu, inductor)."""
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    return optimize(lower_file(str(dsl)), parallel="tp1", target="cpu", backend="inductor")


def random_checkpoint(module):
    """The module's random:0 checkpoint, materialized once under the shared test store."""
    from conftest import shared_store_dir

    from difflet.codegen.checkpoint import resolve_weights

    return resolve_weights(module, "random:0", shared_store_dir())


def compile_art(module, ckpt, out: Path) -> Path:
    """Codegen `module` into `out` with programs from (or into) the shared test store."""
    from conftest import shared_store_dir

    from difflet.codegen.driver import codegen

    codegen(module, str(ckpt), out, store=shared_store_dir(), log=lambda *_: None)
    return out
