"""`difflet check` on the real-size image-input descriptions (issue 29): each is its base
description (checked in test_check_real_size.py) plus the programs it adds, and those are checked
here with the same rules (real_size_util.check_components: cpu exports through the CLI, trn2 where
it differs). A file of its own so the suite's workers run it beside the base checks.

Oracle: the rules as difflet/codegen/graph_checks.py states them with their sources, each shown to
fire in tests/test_graph_checks.py; the base descriptions' components, compared attribute by
attribute, for what is not checked again.
"""
from __future__ import annotations

import pytest

from difflet.ir.nodes import Op
from real_size_util import IMAGE_INPUT, check_components, lowering


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    return lowering(tmp_path_factory.mktemp("real-size-images"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flux-img2img", "qwen-image-img2img"])
def test_an_image_input_profile_adds_only_a_vae_encoder_which_passes(lowered, name):
    """Its other components are its base description's (checked there) and its inpainting
    sibling's components are its own, so the VAE encoder is the one new program to check."""
    base, _ = lowered(IMAGE_INPUT[name])
    module, ir = lowered(name)
    keys = ("class", "config", "dtype", "entry")
    others = [c.name for c in module.components() if c.name != "vae_encoder"]
    assert others == [c.name for c in base.components()]
    assert all(module.component(n).attrs.get(k) == base.component(n).attrs.get(k) for n in others for k in keys)
    sibling, _ = lowered(name.replace("img2img", "inpaint"))
    assert [(c.name, *(c.attrs.get(k) for k in keys)) for c in sibling.components()] == \
        [(c.name, *(c.attrs.get(k) for k in keys)) for c in module.components()]
    check_components(module, ir, ["vae_encoder"])


@pytest.mark.slow
def test_flux_kontext_adds_a_vae_encoder_and_joins_the_image_tokens_which_pass(lowered):
    """flux-kontext is flux's classes and configs; its transformer takes the image's 4096 tokens
    beside the output's (a shape only), so the VAE encoder and that transformer are checked."""
    base, _ = lowered("flux")
    module, ir = lowered("flux-kontext")
    keys = ("class", "config", "dtype", "entry")
    assert [c.name for c in module.components() if c.name != "vae_encoder"] == [c.name for c in base.components()]
    assert all(module.component(c.name).attrs.get(k) == c.attrs.get(k) for c in base.components() for k in keys)
    check_components(module, ir, ["vae_encoder", "transformer"])


@pytest.mark.slow
def test_wan_image_to_video_adds_a_clip_encoder_a_vae_encoder_and_its_transformer_which_pass(lowered):
    """wan2.1-i2v is wan2.1 (its UMT5 and VAE decoder unchanged, checked there) with a CLIP image
    encoder, a whole-clip VAE encoder and the I2V transformer: the three new programs are checked."""
    base, _ = lowered("wan2.1")
    module, ir = lowered("wan2.1-i2v")
    keys = ("class", "config", "dtype", "entry")
    new = ["image_encoder", "transformer", "vae_encoder"]
    assert sorted(set(c.name for c in module.components()) - {"text_encoder", "vae"}) == new
    assert all(module.component(n).attrs.get(k) == base.component(n).attrs.get(k)
               for n in ("text_encoder", "vae") for k in keys)
    check_components(module, ir, new)


@pytest.mark.slow
def test_ltx2_image_to_video_adds_a_vae_encoder_and_a_per_token_timestep_which_pass(lowered):
    """ltx2-i2v is ltx2 (its text encoder, connectors and decoders unchanged, checked there) with
    the VAE's encoder program and a transformer taking the per-token `video_timestep` (and its
    timesteps in float32, as the pipeline passes them): the two programs are checked."""
    base, _ = lowered("ltx2")
    module, ir = lowered("ltx2-i2v")
    keys = ("class", "config", "dtype", "entry")
    new = ["transformer", "vae_encoder"]
    same = [c.name for c in base.components() if c.name != "transformer"]
    assert sorted(set(c.name for c in module.components()) - set(same)) == new
    assert all(module.component(n).attrs.get(k) == base.component(n).attrs.get(k) for n in same for k in keys)
    check_components(module, ir, new)


@pytest.mark.slow
def test_wan22_ti2v_image_to_video_adds_a_vae_encoder_and_a_per_token_timestep_which_pass(lowered):
    """wan2.2-ti2v-5b-i2v is wan2.2-ti2v-5b (its UMT5 and VAE decoder unchanged, checked there)
    with the residual VAE's encoder program for the image alone and a transformer taking t per
    token ([1, 27280] float32, the pipeline's mask x t; the per-token modulation path): the two
    programs are checked."""
    base, _ = lowered(IMAGE_INPUT["wan2.2-ti2v-5b-i2v"])
    module, ir = lowered("wan2.2-ti2v-5b-i2v")
    keys = ("class", "config", "dtype", "entry")
    new = ["transformer", "vae_encoder"]
    same = [c.name for c in base.components() if c.name != "transformer"]
    assert sorted(set(c.name for c in module.components()) - set(same)) == new
    assert all(module.component(n).attrs.get(k) == base.component(n).attrs.get(k) for n in same for k in keys)
    assert all(module.component("transformer").attrs.get(k) == base.component("transformer").attrs.get(k)
               for k in keys)  # only its timestep's shape differs
    (t,) = module.component("transformer").find(Op.INPUT, "timestep")
    assert list(t.results[0].type.shape) == [1, 31 * 22 * 40] and t.results[0].type.dtype == "float32"
    check_components(module, ir, new)


@pytest.mark.slow
def test_wan_first_last_frame_adds_a_two_image_clip_batch_and_the_image_position_embedding(lowered):
    """wan2.1-flf2v is wan2.1-i2v (its UMT5, VAE encoder and decoder unchanged, checked there) at
    720x1280 with CLIP reading two images as one batch and the FLF2V transformer (pos_embed_seq_len
    514: the two images' 257 tokens viewed as one sequence): those two programs are checked."""
    base, _ = lowered(IMAGE_INPUT["wan2.1-flf2v"])
    module, ir = lowered("wan2.1-flf2v")
    keys = ("class", "config", "dtype", "entry")
    same = ["text_encoder", "vae_encoder", "vae"]
    assert all(module.component(n).attrs.get(k) == base.component(n).attrs.get(k) for n in same for k in keys)
    ours, theirs = dict(module.component("transformer").attrs["config"]), dict(base.component("transformer").attrs["config"])
    assert ours.pop("pos_embed_seq_len") == 514 and ours == theirs
    (pixels,) = module.component("image_encoder").find(Op.INPUT)
    assert list(pixels.results[0].type.shape) == [2, 3, 224, 224]
    check_components(module, ir, ["image_encoder", "transformer"])
