"""bench/real_size_checkpoint.py (issue 34's test data) at toy widths through the same code path:
the oracles are diffusers' and transformers' own loaders (no missing, unexpected or mismatched
key; the tied UMT5 embedding stored once and tied on load) and save_pretrained's layout (the
same keys, index files naming every shard)."""
from __future__ import annotations

import json
import sys

import pytest
import torch

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import real_size_checkpoint as rsc  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("rsc")
    old = rsc.SHARD_BYTES
    rsc.SHARD_BYTES = 20_000  # several shards per component at toy widths
    try:
        stats = rsc.write_checkpoint(out, seed=0, tiny=True)
    finally:
        rsc.SHARD_BYTES = old
    return out, stats


def test_every_component_loads_with_no_missing_or_unexpected_key(ckpt):
    import diffusers
    import transformers

    out, stats = ckpt
    te, info = transformers.UMT5EncoderModel.from_pretrained(out, subfolder="text_encoder", dtype=torch.bfloat16,
                                                             output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert te.shared.weight.data_ptr() == te.encoder.embed_tokens.weight.data_ptr()  # tied on load
    for sub, cls in (("transformer", diffusers.WanTransformer3DModel), ("vae", diffusers.AutoencoderKLWan)):
        model, info = cls.from_pretrained(out, subfolder=sub, output_loading_info=True)
        assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), (sub, info)
        assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(s["shards"] > 1 for s in stats.values()), stats


def test_keys_and_index_are_save_pretrained_s(ckpt, tmp_path):
    """Exactly the tensor names save_pretrained writes for each class at the same config (the
    tied UMT5 embedding once), and an index naming every shard file that exists."""
    import diffusers
    import transformers
    from safetensors import safe_open

    out, _ = ckpt
    refs = {"transformer": diffusers.WanTransformer3DModel.from_config(
                diffusers.WanTransformer3DModel.load_config(out / "transformer")),
            "text_encoder": transformers.UMT5EncoderModel(  # built, not loaded: the class's own tying
                transformers.UMT5Config.from_pretrained(out / "text_encoder"))}
    for sub, model in refs.items():
        model.save_pretrained(tmp_path / sub)
        stored = set()
        for f in (tmp_path / sub).glob("*.safetensors"):
            with safe_open(str(f), framework="pt") as st:
                stored |= set(st.keys())
        stem = "diffusion_pytorch_model" if sub == "transformer" else "model"
        index = json.loads((out / sub / f"{stem}.safetensors.index.json").read_text())
        assert set(index["weight_map"]) == stored, sub
        assert all((out / sub / f).is_file() for f in set(index["weight_map"].values())), sub
    assert json.loads((out / "model_index.json").read_text())["_class_name"] == "WanPipeline"


def test_the_stored_dtypes_are_the_published_ones(ckpt):
    from safetensors import safe_open

    out, _ = ckpt
    for sub, want in (("text_encoder", "BF16"), ("transformer", "BF16"), ("vae", "F32")):
        for f in (out / sub).glob("*.safetensors"):
            with safe_open(str(f), framework="pt") as st:
                assert {st.get_slice(k).get_dtype() for k in st.keys()} == {want}, (sub, f.name)
