"""The program cache key changes with every library a program is built from (issue 35).

Oracle: the store itself. A program entry produced under today's installed versions must not be
handed out after an upgrade of torch, diffusers or transformers (their classes' forward code and
the export decide what a program computes), nor after a change of the backend's toolchain.
"""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from difflet.codegen.store import Store
from difflet.frontend.lower import lower_file
from difflet.passes import cache_key
from difflet.passes.pipeline import optimize

REPO = Path(__file__).resolve().parent.parent
REAL_VERSION = importlib.metadata.version


def _key(dist_versions: dict[str, str], monkeypatch, backend: str = "inductor") -> str:
    """The tiny FLUX denoiser's cache key with `dist_versions` standing in for installed versions."""
    monkeypatch.setattr(cache_key.importlib.metadata, "version",
                        lambda d: dist_versions.get(d) or REAL_VERSION(d))
    target = "trn2" if backend == "neuron" else "cpu"
    planned = optimize(lower_file(REPO / "models" / "flux-tiny.dsl"), "tp1", target=target, backend=backend,
                       difflet_version="0.1.0")
    return planned.component("transformer").attrs["cache_key"]


@pytest.mark.parametrize("dist", ["torch", "diffusers", "transformers"])
def test_a_changed_library_version_misses_the_store(dist, monkeypatch, tmp_path):
    store, produced = Store(tmp_path), []

    def produce(dest: Path) -> None:
        produced.append(dest)
        dest.write_text("program")

    before = _key({}, monkeypatch)
    store.get_or_create("inductor", before, produce)
    store.get_or_create("inductor", before, produce)
    assert len(produced) == 1                      # same versions: the entry is reused
    after = _key({dist: "999.0"}, monkeypatch)
    assert after != before and not store.has("inductor", after)
    store.get_or_create("inductor", after, produce)
    assert len(produced) == 2                      # the upgrade compiles anew


@pytest.mark.parametrize("dist", ["neuronx-cc", "torch-neuronx", "neuronx-distributed", "diffusers"])
def test_the_neuron_key_carries_its_toolchain(dist, monkeypatch):
    assert _key({dist: "999.0"}, monkeypatch, "neuron") != _key({}, monkeypatch, "neuron")


def test_the_compiler_input_names_each_library_once():
    names = [part.split("==")[0] for part in cache_key.compiler_version("inductor").split()]
    assert names == ["torch", "diffusers", "transformers"]
