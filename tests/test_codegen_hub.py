"""`--weights hf:ORG/NAME`: resolved from a local Hugging Face cache laid out as huggingface_hub writes it."""
from __future__ import annotations

import shutil

import pytest

from difflet.codegen.checkpoint import load_component, resolve_weights
from difflet.errors import DiffletError


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, flux_tiny_ckpt):
    """A cache holding flux-tiny's checkpoint as snapshot REV of difflet/flux-tiny (refs/main -> REV)."""
    rev = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--difflet--flux-tiny"
    shutil.copytree(flux_tiny_ckpt, repo / "snapshots" / rev)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return repo / "snapshots" / rev


def test_hf_spec_resolves_to_the_cached_snapshot_and_loads(flux_tiny_module, hub_cache):
    path = resolve_weights(flux_tiny_module, "hf:difflet/flux-tiny")
    assert path.resolve() == hub_cache.resolve()
    vae = load_component(flux_tiny_module.component("vae"), path)  # the same loader as a local dir
    assert type(vae).__name__ == "AutoencoderKL"


@pytest.mark.parametrize("spec, message", [
    ("hf:difflet/not-cached", "not in the local Hugging Face cache"),
    ("hf:no-slash", "expected hf:ORG/NAME"),
])
def test_hf_spec_errors_name_the_flag(flux_tiny_module, hub_cache, spec, message):
    with pytest.raises(DiffletError, match=message) as err:
        resolve_weights(flux_tiny_module, spec)
    assert err.value.where == "--weights"
