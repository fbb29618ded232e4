"""The Python API and configs from the checkpoint, against diffusers' FluxPipeline.

Oracle: `FluxPipeline.from_pretrained(DIR)` on a FLUX checkpoint whose dimensions no description
in models/ states (a random "fine-tune": 3 heads of 8, T5 d_model 24, a 3-block VAE with 2 latent
channels), and `DiffletPipeline.from_pretrained(DIR, model="flux")`, which must take every config
from that checkpoint through models/flux.dsl. FLUX.1-schnell's description is checked the same
way on a checkpoint without guidance embedding.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import shared_store_dir
from difflet import DiffletPipeline
from difflet.errors import DiffletError
from oracle_util import assert_images_close

pytestmark = pytest.mark.slow  # compiles and serves several artifacts: full suite only

REPO = Path(__file__).resolve().parent.parent
# The checkpoint's configs, in the order of models/flux.dsl's `default { ... }` blocks.
FINE_TUNE = (
    """vocab_size: 1000, hidden_size: 20, intermediate_size: 29, num_hidden_layers: 1
    num_attention_heads: 2, max_position_embeddings: 77, projection_dim: 20
    bos_token_id: 1, eos_token_id: 2, pad_token_id: 0""",
    """vocab_size: 1000, d_model: 24, d_ff: 30, d_kv: 8, num_layers: 1, num_heads: 3
    relative_attention_num_buckets: 8, feed_forward_proj: "gated-gelu"
    pad_token_id: 0, eos_token_id: 2, decoder_start_token_id: 0""",
    """patch_size: 1, in_channels: 8, num_layers: 1, num_single_layers: 1, attention_head_dim: 8
    num_attention_heads: 3, joint_attention_dim: 24, pooled_projection_dim: 20
    guidance_embeds: GUIDANCE, axes_dims_rope: [2, 2, 4]""",
    """in_channels: 3, out_channels: 3, latent_channels: 2, layers_per_block: 1, norm_num_groups: 4
    down_block_types: ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"]
    up_block_types: ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"]
    block_out_channels: [8, 8, 16], sample_size: 64, scaling_factor: 0.3611, shift_factor: 0.1159
    use_quant_conv: false, use_post_quant_conv: false""",
)
SIZE = dict(height=64, width=64, max_sequence_length=16)
CALL = dict(prompt="a red fox in the snow", num_inference_steps=3, seed=5)


def _checkpoint(dsl: str, guidance_embeds: bool) -> Path:
    """Materialize a random checkpoint of the FINE_TUNE configs through `dsl`'s own shapes."""
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.frontend.lower import lower_text

    text = (REPO / "models" / dsl).read_text()
    blocks = iter(FINE_TUNE)
    text = re.sub(r"default \{[^}]*\}", lambda _: "default {" + next(blocks) + "}", text)
    text = text.replace("GUIDANCE", "true" if guidance_embeds else "false")
    module = lower_text(text, f"fine-tune of {dsl}", {"height": "64", "width": "64", "max_text": "16",
                                                      "dtype": "float32"})
    return resolve_weights(module, "random:3", shared_store_dir())


@pytest.fixture(scope="module")
def fine_tune() -> Path:
    return _checkpoint("flux.dsl", guidance_embeds=True)


@pytest.fixture(scope="module")
def pipe(fine_tune):
    with DiffletPipeline.from_pretrained(fine_tune, model="flux", dtype=torch.float32,
                                         store=shared_store_dir(), **SIZE) as p:
        yield p


def _reference(ckpt: Path, **call) -> np.ndarray:
    from diffusers import FluxPipeline

    ref = FluxPipeline.from_pretrained(str(ckpt))
    ref.set_progress_bar_config(disable=True)
    seed = call.pop("seed")
    out = ref(generator=torch.Generator("cpu").manual_seed(seed), height=64, width=64,
              max_sequence_length=16, output_type="pil", **call)
    return np.asarray(out.images[0])


def test_flux_description_serves_a_checkpoint_of_other_dimensions(pipe, fine_tune):
    transformer = pipe.runner.module.component("transformer")
    assert transformer.attrs["config"]["num_attention_heads"] == 3  # taken from the checkpoint
    out = pipe(guidance_scale=2.5, **CALL)
    assert out.seeds == [5] and len(out.images) == 1
    ours = np.asarray(out.images[0])
    assert ours.shape == (64, 64, 3) and ours.std() > 0
    assert_images_close(ours, _reference(fine_tune, guidance_scale=2.5, **CALL), "DiffletPipeline vs FluxPipeline")


def test_generator_seed_and_images_per_prompt(pipe):
    """A torch.Generator gives its seed; image i of n equals a single call with seed + i."""
    two = pipe("a blue square", num_images_per_prompt=2, num_inference_steps=2,
               generator=torch.Generator().manual_seed(11), output_type="np")
    assert two.seeds == [11, 12]
    second = pipe("a blue square", num_inference_steps=2, seed=12, output_type="np")
    assert np.array_equal(two.images[1], second.images[0])  # the same program, inputs and host code
    assert not np.array_equal(two.images[0], two.images[1])
    assert two.images[0].dtype == np.float32 and 0.0 <= two.images[0].min() <= two.images[0].max() <= 1.0


def test_second_from_pretrained_compiles_and_rewrites_nothing(pipe, fine_tune):
    manifest = pipe.art / "manifest.json"
    before = manifest.stat().st_mtime_ns
    lines = []
    again = DiffletPipeline.from_pretrained(fine_tune, model="flux", dtype="float32", store=shared_store_dir(),
                                            log=lines.append, **SIZE)
    assert again.art == pipe.art and lines == [] and manifest.stat().st_mtime_ns == before


def test_without_a_model_the_checkpoints_model_index_names_it(pipe, fine_tune):
    """FluxPipeline in model_index.json with a guidance embedding -> models/flux.dsl: the very
    artifact `model="flux"` made, nothing compiled."""
    lines = []
    with DiffletPipeline.from_pretrained(fine_tune, dtype="float32", store=shared_store_dir(), log=lines.append,
                                         **SIZE) as found:
        assert found.art == pipe.art and lines == []


@pytest.mark.parametrize("call,argument", [
    (dict(height=128), "height"),
    (dict(num_inference_steps=0), "num_inference_steps"),
    (dict(guidance_scale=-1.0), "guidance_scale"),
    (dict(num_frames=9), "num_frames"),
    (dict(output_type="latent"), "output_type"),
])
def test_bad_arguments_are_named(pipe, call, argument):
    with pytest.raises(DiffletError) as err:
        pipe("a cat", seed=0, **call)
    assert err.value.where == argument and str(err.value).startswith(f"{argument}: ")


def test_unknown_model_lists_the_descriptions():
    with pytest.raises(DiffletError, match=r"unknown model 'flux3' \(one of .*flux-schnell.*\)"):
        DiffletPipeline.from_pretrained("random:0", model="flux3")


def test_stated_config_contradicted_by_the_checkpoint_is_located(fine_tune, monkeypatch):
    """flux-tiny.dsl states its configs inline; this checkpoint has other values."""
    monkeypatch.chdir(REPO)  # the location holds the path as given
    from click.testing import CliRunner

    from difflet.cli import main

    r = CliRunner().invoke(main, ["lower", "models/flux-tiny.dsl", "--weights", str(fine_tune)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    head, snippet = r.stderr.strip().split("\n")
    assert re.fullmatch(r"error: models/flux-tiny\.dsl:24:27: component 'text_encoder': the description "
                        r"states hidden_size = 32, the checkpoint's text_encoder/config\.json has 20", head), head
    assert snippet.strip().startswith("hidden_size: 32")


def test_schnell_description_serves_a_checkpoint_without_guidance_embedding():
    """Named by model_index.json too: no guidance embedding -> flux-schnell.dsl."""
    ckpt = _checkpoint("flux-schnell.dsl", guidance_embeds=False)
    with DiffletPipeline.from_pretrained(ckpt, dtype="float32", store=shared_store_dir(), **SIZE) as schnell:
        assert "guidance" not in [i.name for i in schnell.runner.module.component("transformer").body]
        assert schnell.profile["steps"] == 4
        ours = np.asarray(schnell(prompt="a green tree", seed=2).images[0])
    # FluxPipeline ignores guidance_scale without a guidance embedding, as Difflet does
    assert_images_close(ours, _reference(ckpt, prompt="a green tree", seed=2, num_inference_steps=4),
                        "flux-schnell vs FluxPipeline")

