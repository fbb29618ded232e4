"""models/wan2.1.dsl takes every config from the checkpoint, against diffusers' WanPipeline.

Oracle: `WanPipeline.from_pretrained(DIR)` on a Wan 2.1 checkpoint whose dimensions no description
in models/ states (3 heads of 8, 2 layers, UMT5 d_model 24, a VAE of base_dim 8 with dim_mult
[1, 2, 3, 3], one resnet per block and its temporal upsamples at other levels than Wan's), built
from the real diffusers/transformers classes and saved sharded (index files), and
`DiffletPipeline.from_pretrained(DIR)` (no model name: wan2.1 found from model_index.json), which
must take every config, and the
VAE's causal-cache channel counts the wan family derives from them, from that checkpoint.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import shared_store_dir
from difflet.errors import DiffletError
from difflet.ir.nodes import Op
from oracle_util import assert_images_close, io_shape as _shape

pytestmark = pytest.mark.slow  # compiles and serves a model: full suite only

REPO = Path(__file__).resolve().parent.parent
WAN = REPO / "models" / "wan2.1.dsl"
UMT5 = dict(vocab_size=1000, d_model=24, d_ff=30, d_kv=8, num_layers=1, num_heads=3,
            relative_attention_num_buckets=8, feed_forward_proj="gated-gelu",
            pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
TRANSFORMER = dict(patch_size=(1, 2, 2), num_attention_heads=3, attention_head_dim=8, in_channels=4,
                   out_channels=4, text_dim=24, freq_dim=16, ffn_dim=40, num_layers=2, cross_attn_norm=True,
                   qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=64)
# temperal_downsample [T, T, F]: the decoder upsamples time at levels 1 and 2 (Wan's: 0 and 1)
VAE = dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 3, 3], num_res_blocks=1, temperal_downsample=[True, True, False],
           latents_mean=[0.2, -0.1, 0.0, 0.3], latents_std=[1.3, 0.9, 1.1, 1.7])
CACHE_CHANNELS = [196, 108, 76, 40]  # what AutoencoderKLWan's decoder caches at each level (checked below)
SIZE = dict(height=32, width=32, num_frames=9, max_sequence_length=16)
CALL = dict(prompt="a red fox running through the snow", num_inference_steps=3, guidance_scale=4.0, seed=5)


def _build(dest: Path, vae_config: dict = VAE) -> Path:
    """The checkpoint: WanPipeline of freshly initialized classes, save_pretrained with small shards."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    from difflet.codegen.tiny_tokenizers import special_ids, word_level_tokenizer

    word_level_tokenizer(UMT5["vocab_size"], special_ids(UMT5), clip_style=False, max_length=16,
                         dest=dest / "tokenizer_src")
    torch.manual_seed(0)
    text_encoder = UMT5EncoderModel(UMT5Config(**UMT5)).eval()
    torch.manual_seed(1)
    transformer = WanTransformer3DModel(**TRANSFORMER).eval()
    torch.manual_seed(2)
    vae = AutoencoderKLWan(**vae_config).eval()
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
                                        solver_order=2, solver_type="bh2", num_train_timesteps=1000)
    pipe = WanPipeline(tokenizer=PreTrainedTokenizerFast.from_pretrained(str(dest / "tokenizer_src")),
                       text_encoder=text_encoder, transformer=transformer, vae=vae, scheduler=scheduler)
    ckpt = dest / "ckpt"
    pipe.save_pretrained(str(ckpt), max_shard_size="40KB")
    return ckpt


@pytest.fixture(scope="module")
def fine_tune(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("wan-fine-tune"))


@pytest.fixture(scope="module")
def pipe(fine_tune):
    from difflet import DiffletPipeline

    with DiffletPipeline.from_pretrained(fine_tune, dtype="float32", store=shared_store_dir(),
                                         **SIZE) as p:
        yield p


def _reference(ckpt: Path, prompt: str, seed: int, **call) -> np.ndarray:
    from diffusers import WanPipeline

    ref = WanPipeline.from_pretrained(str(ckpt))
    ref.set_progress_bar_config(disable=True)
    out = ref(prompt, generator=torch.Generator("cpu").manual_seed(seed), height=SIZE["height"],
              width=SIZE["width"], num_frames=SIZE["num_frames"],
              max_sequence_length=SIZE["max_sequence_length"], output_type="np", **call)
    return (out.frames[0] * 255).round().astype(np.uint8)


def test_checkpoint_is_sharded(fine_tune):
    assert (fine_tune / "transformer" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    assert not (fine_tune / "transformer" / "diffusion_pytorch_model.safetensors").exists()


def test_wan_description_serves_a_checkpoint_of_other_dimensions(pipe, fine_tune):
    module = pipe.runner.module
    transformer, vae = module.component("transformer"), module.component("vae")
    assert transformer.attrs["config"]["num_attention_heads"] == 3  # taken from the checkpoint
    assert [(a.attrs["heads"], a.attrs["head_dim"]) for a in transformer.find(Op.ATTENTION)] \
        == [(3, 8), (3, 8)]
    assert _shape(transformer, "hidden_states") == [1, 4, 3, 4, 4]
    assert _shape(transformer, "encoder_hidden_states") == [1, 16, 24]
    assert _shape(module.component("text_encoder"), "prompt_embeds") == [1, 16, 24]
    assert [_shape(vae, f"cache{k}")[1] for k in range(4)] == CACHE_CHANNELS  # the build checked them too
    assert "cache0_channels" not in vae.attrs["config"]  # derived keys stay out of the IR
    out = pipe(output_type="np", **CALL)
    _assert_frames_are_the_pipelines((out.frames[0] * 255).round().astype(np.uint8), fine_tune, "DiffletPipeline")


def _assert_frames_are_the_pipelines(ours: np.ndarray, ckpt: Path, what: str) -> None:
    """CALL's video from WanPipeline on `ckpt`, every frame under the closeness rule."""
    assert ours.shape == (9, 32, 32, 3) and ours.std() > 0
    call = {k: v for k, v in CALL.items() if k not in ("prompt", "seed")}
    ref = _reference(ckpt, CALL["prompt"], CALL["seed"], **call)
    for i, (got, want) in enumerate(zip(ours, ref, strict=True)):
        assert_images_close(got, want, f"frame {i}: {what} vs WanPipeline")


def test_a_vae_of_another_temporal_scale(tmp_path):
    """One temporal upsample (2x, the config's scale_factor_temporal 2): 9 frames are 5 latent
    frames, each later chunk decodes 2 video frames (host and chunk decoder read it from the IR).
    Run on the eager program modules (the very modules codegen compiles; compiling them is what
    the served test above checks), so the suite pays no second Wan compile."""
    from difflet.codegen.artifacts import eager_programs
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize
    from difflet.runtime.runner import ModelRunner

    ckpt = _build(tmp_path, dict(VAE, temperal_downsample=[False, True, False], scale_factor_temporal=2))
    profile = {"height": "32", "width": "32", "frames": "9", "max_text": "16", "dtype": "float32"}
    module = optimize(lower_file(str(WAN), profile, str(ckpt)))
    assert _shape(module.component("transformer"), "hidden_states") == [1, 4, 5, 4, 4]
    assert _shape(module.component("vae"), "sample") == [1, 3, 2, 32, 32]
    assert [_shape(module.component("vae"), f"cache{k}")[1] for k in range(4)] == [196, 108, 60, 40]
    runner = ModelRunner(module, eager_programs(module, ckpt), ckpt)
    params = runner.resolve(prompt=CALL["prompt"], seed=CALL["seed"], steps=CALL["num_inference_steps"],
                            guidance=CALL["guidance_scale"])
    _assert_frames_are_the_pipelines(runner.generate(params).video, ckpt, "eager programs")


def test_derived_cache_channels_are_the_models(fine_tune):
    """The family's derived counts equal what AutoencoderKLWan's decoder caches (wan/vae.py's
    shape-only run), for the fine-tune and for Wan 2.1's own VAE (on the meta device)."""
    from diffusers import AutoencoderKLWan

    from difflet.families.wan.facts import vae_derived
    from difflet.families.wan.vae import cache_layout

    for config in (VAE, {}):
        with torch.device("meta"):
            vae = AutoencoderKLWan(**config)
        slots = cache_layout(vae, (1, vae.config.z_dim, 1, 4, 4))
        levels = sorted({h for _, h, _ in slots})
        want = [sum(c for c, h, _ in slots if h == lv) for lv in levels]
        derived = vae_derived(dict(config))
        assert [derived[f"cache{k}_channels"] for k in range(4)] == want
        assert derived["scale_factor_temporal"] == 4
    assert want == [4240, 2496, 1152, 672]


def test_without_weights_the_14b_shapes():
    from difflet.frontend.lower import lower_file
    from difflet.passes.model_facts import tokens

    module = lower_file(str(WAN))
    transformer, vae = module.component("transformer"), module.component("vae")
    assert tokens(transformer)["visual"] == 21 * 30 * 52 == 32760 and tokens(transformer)["text"] == 512
    assert _shape(transformer, "hidden_states") == [1, 16, 21, 60, 104]
    assert _shape(module.component("text_encoder"), "prompt_embeds") == [1, 512, 4096]
    assert [(a.attrs["heads"], a.attrs["head_dim"]) for a in transformer.find(Op.ATTENTION)] \
        == [(40, 128), (40, 128)]
    assert [_shape(vae, f"cache{k}") for k in range(4)] == [
        [1, 4240, 2, 60, 104], [1, 2496, 2, 120, 208], [1, 1152, 2, 240, 416], [1, 672, 2, 480, 832]]
    assert _shape(vae, "sample") == [1, 3, 4, 480, 832]


def test_the_13b_configs_lower_without_weights_files(tmp_path):
    """Only config.json files are read at lower time: Wan2.1-T2V-1.3B's configs give its heads and
    the VAE's cache channels come from a config.json without scale_factor_* (as older ones are)."""
    from transformers import UMT5Config

    from difflet.frontend.lower import lower_file

    umt5 = UMT5Config(vocab_size=256384, d_model=4096, d_ff=10240, d_kv=64, num_layers=24, num_heads=64,
                      feed_forward_proj="gated-gelu").to_dict()
    for sub, config in (("text_encoder", umt5),
                        ("transformer", dict(TRANSFORMER, num_attention_heads=12, attention_head_dim=128,
                                             in_channels=16, out_channels=16, text_dim=4096, freq_dim=256,
                                             ffn_dim=8960, num_layers=30, rope_max_seq_len=1024)),
                        ("vae", dict(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                                     temperal_downsample=[False, True, True]))):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "config.json").write_text(json.dumps(config))
    module = lower_file(str(WAN), weights=str(tmp_path))
    transformer = module.component("transformer")
    assert [a.attrs["heads"] for a in transformer.find(Op.ATTENTION)] == [12, 12]
    assert 1.2e9 < transformer.attrs["params"] < 1.5e9
    assert [_shape(module.component("vae"), f"cache{k}")[1] for k in range(4)] == [4240, 2496, 1152, 672]
    assert _shape(module.component("vae"), "sample")[2] == 4  # 2 ** its two temporal upsamples


def test_stated_config_contradicted_by_the_checkpoint_is_located(fine_tune, monkeypatch):
    """wan2.1-tiny.dsl states its configs inline; this checkpoint has other values."""
    monkeypatch.chdir(REPO)  # the location holds the path as given
    from click.testing import CliRunner

    from difflet.cli import main

    lines = (REPO / "models" / "wan2.1-tiny.dsl").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "d_model: 32" in text)
    col = lines[line - 1].index("d_model") + 1
    r = CliRunner().invoke(main, ["lower", "models/wan2.1-tiny.dsl", "--weights", str(fine_tune)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    head, snippet = r.stderr.strip().split("\n")
    assert re.fullmatch(rf"error: models/wan2\.1-tiny\.dsl:{line}:{col}: component 'text_encoder': the "
                        r"description states d_model = 32, the checkpoint's text_encoder/config\.json has 24",
                        head), head
    assert snippet.strip().startswith("d_model: 32")


def test_a_vae_without_derived_keys_is_a_located_error(tmp_path):
    """A VAE of three spatial levels has no fourth causal cache: the family derives counts for the
    levels the config has, and the first expression that reads a missing one says so at its location
    (the residual VAE of Wan 2.2 derives all four, tests/test_wan22_ti2v.py)."""
    from difflet.frontend.lower import lower_file

    for sub, config in (("text_encoder", UMT5), ("transformer", TRANSFORMER),
                        ("vae", dict(VAE, dim_mult=[1, 2, 3], temperal_downsample=[True, True]))):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "config.json").write_text(json.dumps(config))
    with pytest.raises(DiffletError, match="has no key 'cache3_channels'") as err:
        lower_file(str(WAN), {"height": "32", "width": "32", "frames": "9", "max_text": "16"}, str(tmp_path))
    assert str(err.value.where).startswith(f"{WAN}:")
