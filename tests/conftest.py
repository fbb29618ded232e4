"""Session fixtures shared by every test: the flux-tiny module, its random:0 checkpoint, its artifacts.

Compiled programs go to a store at $DIFFLET_TEST_STORE or <repo>/.pytest_cache/difflet-store, so
they are reused across tests and runs (a cache hit never compiles).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Three xdist workers share the two cores: one intra-op thread each (before torch runs an op; the
# servers and rank workers a test starts inherit it). Two per worker oversubscribe the cores, and
# OpenMP threads spinning after each parallel region take time from the other workers.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    # The workers already keep both cores busy: a codegen's own compile pool (one spawned process per
    # missing program, each importing torch and the model libraries) only adds CPU time. Measured for
    # wan2.1-tiny's 3 programs: 94-105 CPU-s pooled vs 83-86 in-process. Tests of the pool set it.
    os.environ.setdefault("DIFFLET_COMPILE_WORKERS", "1")
FLUX_TINY_DSL = REPO / "models" / "flux-tiny.dsl"

# Handed out first, in this order: the quick tier's costliest files (seconds of worker time there).
# The five family files compile the tiny families side by side, then test_memory_model reuses their
# programs from the store; measured 517 s for the quick tier with this order, 599 s without.
# (The full suite's costliest first measured slower: together they oversubscribe the two cores.)
FIRST = ("test_http_api.py", "test_model_qwen_image.py", "test_model_ltx2.py", "test_model_wan.py",
         "test_graph_checks.py", "test_model_hunyuan_video.py", "test_memory_model.py")


def pytest_collection_modifyitems(items):
    """FIRST's files first, in its order; every other file after, in collection order."""
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: tests keep their order


def shared_store_dir() -> Path:
    """The program store shared by all tests (compiled programs survive across runs)."""
    return Path(os.environ.get("DIFFLET_TEST_STORE") or REPO / ".pytest_cache" / "difflet-store")


@pytest.fixture(scope="session", autouse=True)
def state_home(tmp_path_factory) -> Path:
    """$XDG_STATE_HOME of every server a test starts: a per-worker directory, so an HTTP server's
    default --state-dir is never the user's own and never another worker's."""
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))
    return Path(os.environ["XDG_STATE_HOME"])


@pytest.fixture(scope="session")
def difflet_test_store() -> Path:
    return shared_store_dir()


def _flux_tiny_module():
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    return optimize(lower_file(str(FLUX_TINY_DSL)), parallel="tp1", target="cpu", backend="inductor")


@pytest.fixture(scope="session")
def flux_tiny_module():
    """flux-tiny lowered and optimized for tp1/cpu/inductor (planned level)."""
    return _flux_tiny_module()


@pytest.fixture(scope="session")
def flux_tiny_ckpt(flux_tiny_module):
    """The random:0 checkpoint of flux-tiny, materialized (once) under the test store."""
    from difflet.codegen.checkpoint import resolve_weights

    return resolve_weights(flux_tiny_module, "random:0", shared_store_dir())


@pytest.fixture(scope="session")
def flux_tiny_art(flux_tiny_module, flux_tiny_ckpt, tmp_path_factory):
    """flux-tiny codegen'd with the inductor backend into a fresh ART dir (programs from the test store)."""
    from difflet.codegen.driver import codegen

    out = tmp_path_factory.mktemp("flux-tiny-art")
    codegen(flux_tiny_module, str(flux_tiny_ckpt), out, store=shared_store_dir(), log=lambda *_: None)
    return out


@pytest.fixture(scope="session")
def flux_tiny_slow_art(tmp_path_factory):
    """flux-tiny at 128x128 (1024 visual tokens): a profile whose 1000-step request takes many
    seconds on any CPU, for deadline tests (the 32x32 profile can finish 1000 steps in < 1 s)."""
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.driver import codegen
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    module = optimize(lower_file(str(FLUX_TINY_DSL), {"height": "128", "width": "128"}),
                      parallel="tp1", target="cpu", backend="inductor")
    ckpt = resolve_weights(module, "random:0", shared_store_dir())
    out = tmp_path_factory.mktemp("flux-tiny-slow-art")
    codegen(module, str(ckpt), out, store=shared_store_dir(), log=lambda *_: None)
    return out


@pytest.fixture(scope="session")
def tp1_demo(tmp_path_factory, difflet_test_store):
    """model -> (CompletedProcess, output) of one TP1 `difflet demo` per worker (e2e_util.tp1_demo_runner):
    the every-family e2e test checks it and the --parallel tests compare with it."""
    from e2e_util import tp1_demo_runner

    return tp1_demo_runner(tmp_path_factory, difflet_test_store)


@pytest.fixture(scope="module")
def page():
    """A page of Debian's headless Chromium (/usr/bin/chromium, driven by playwright; no download)."""
    chromium = Path("/usr/bin/chromium")
    assert chromium.exists(), "install Debian's chromium (apt-get install chromium); .ci/run does"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), headless=True,
                                    args=["--no-sandbox"])  # CI runs as root
        try:
            yield browser.new_page()
        finally:
            browser.close()
