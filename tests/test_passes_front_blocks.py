"""front-blocks: `difflet opt --front-blocks K` marks the denoiser for block mode.

The golden is the whole planned flux-tiny tp1 IR with --front-blocks 1 (reviewed text;
regenerate with DIFFLET_REGOLD=1 and re-review); beside it, the plan without the option differs
only in the denoiser's `front_blocks` attr and cache key, and what codegen does not build is
refused (tests/test_stepcache_blocks.py has the refusals' words).
"""
from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from difflet.errors import DiffletError
from difflet.frontend.lower import lower_file
from difflet.ir import binary
from difflet.ir.text import parse_module, print_module
from difflet.passes.pipeline import optimize

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden" / "passes"
PINNED = dict(compiler_version="torch==pinned-for-golden", difflet_version="0.1.0")


@pytest.fixture(scope="module")
def flux():
    return lower_file(REPO / "models" / "flux-tiny.dsl")


def test_golden_flux_tiny_front_blocks_1(flux):
    planned = optimize(flux, "tp1", front_blocks=1, **PINNED)
    text = print_module(planned)
    assert parse_module(text) == planned and binary.decode(binary.encode(planned)) == planned
    text = text.replace(f"{REPO}/", "")
    path = GOLDEN / "flux-tiny.tp1.front1.ir.txt"
    if os.environ.get("DIFFLET_REGOLD"):
        path.write_text(text)
    assert text == path.read_text()


def test_only_the_denoisers_mark_and_key_change(flux):
    cut, whole = (optimize(flux, "tp1", front_blocks=k, **PINNED) for k in (1, 0))
    assert [n.name for n in cut.body] == [n.name for n in whole.body]
    for a, b in zip(cut.body, whole.body):
        if a.attrs.get("role") == "denoiser":
            assert a.attrs.get("front_blocks") == 1 and "front_blocks" not in b.attrs
            assert a.attrs["cache_key"] != b.attrs["cache_key"]
            rest = {k: v for k, v in a.attrs.items() if k not in ("front_blocks", "cache_key")}
            assert rest == {k: v for k, v in b.attrs.items() if k != "cache_key"}
            assert a.body == b.body
        else:
            assert a == b  # encoders, decoder, schedule: untouched, same keys (reused)
    assert msgspec.structs.replace(cut, body=()) == msgspec.structs.replace(whole, body=())


def test_counts_out_of_range_are_refused(flux):
    with pytest.raises(DiffletError, match=r"--front-blocks must be >= 0 \(0: the whole denoiser\), got -1"):
        optimize(flux, "tp1", front_blocks=-1, **PINNED)
    optimize(flux, "tp1", front_blocks=2, **PINNED)  # flux-tiny: 1 double + 2 single blocks
    with pytest.raises(DiffletError, match=r"--front-blocks 3: the denoiser transformer has at most 3 blocks, "
                                           r"and the rest needs at least one") as err:
        optimize(flux, "tp1", front_blocks=3, **PINNED)
    assert err.value.where == "--front-blocks"
