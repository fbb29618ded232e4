"""models/qwen-image.dsl takes every config from the checkpoint, against diffusers' QwenImagePipeline.

Oracle: `QwenImagePipeline.from_pretrained(DIR)` on a Qwen-Image checkpoint whose dimensions no
description in models/ states (3 heads of 8 with RoPE axes 2+2+4, 2 layers, a Qwen2.5-VL text
model of hidden size 24, a VAE of base_dim 12, z_dim 3 and dim_mult [1, 2, 3]: 4x spatial, 12
packed channels), built from the real diffusers/transformers classes and saved sharded (index
files), and `DiffletPipeline.from_pretrained(DIR)` with no model named (the family, hence
qwen-image.dsl, is found from model_index.json), which must take every config from that
checkpoint: shapes, heads and head_dim are expressions over them.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import shared_store_dir
from difflet.ir.nodes import Op
from oracle_util import assert_images_close, io_shape as _shape

pytestmark = pytest.mark.slow  # compiles and serves a model: full suite only

REPO = Path(__file__).resolve().parent.parent
QWEN = REPO / "models" / "qwen-image.dsl"
TEXT = dict(vocab_size=1000, hidden_size=24, intermediate_size=30, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            rope_parameters=dict(rope_type="default", mrope_section=[2, 2, 2], rope_theta=1000000.0))
VISION = dict(depth=1, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=24)
TRANSFORMER = dict(patch_size=2, in_channels=12, out_channels=3, num_layers=2, attention_head_dim=8,
                   num_attention_heads=3, joint_attention_dim=24, guidance_embeds=False, axes_dims_rope=(2, 2, 4))
VAE = dict(base_dim=12, z_dim=3, dim_mult=[1, 2, 3], num_res_blocks=1, temperal_downsample=[False, True],
           latents_mean=[0.2, -0.1, 0.3], latents_std=[1.3, 0.9, 1.7])
# the description's scheduler (Difflet builds it from the schedule block, diffusers from the checkpoint)
SCHEDULER = dict(shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256,
                 max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential")
SIZE = dict(height=32, width=32, max_sequence_length=16)
CALL = dict(prompt="a red fox running through the snow", num_inference_steps=3, guidance=4.0, seed=5)
TEMPLATE = 34  # the profile's template tokens


def _build(dest: Path) -> Path:
    """The checkpoint: QwenImagePipeline of freshly initialized classes, save_pretrained with
    small shards; its tokenizer is the tiny Qwen2-shaped one random checkpoints get."""
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline,
                           QwenImageTransformer2DModel)
    from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from difflet.families.qwen_image.programs import write_tokenizer

    text_config = dict(text_config=TEXT, vision_config=VISION)
    write_tokenizer(None, text_config, {"max_length": SIZE["max_sequence_length"] + TEMPLATE},
                    dest / "tokenizer_src")
    torch.manual_seed(0)
    text_encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**text_config)).eval()
    torch.manual_seed(1)
    transformer = QwenImageTransformer2DModel(**TRANSFORMER).eval()
    torch.manual_seed(2)
    vae = AutoencoderKLQwenImage(**VAE).eval()
    pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER), vae=vae,
                             text_encoder=text_encoder,
                             tokenizer=PreTrainedTokenizerFast.from_pretrained(str(dest / "tokenizer_src")),
                             transformer=transformer)
    ckpt = dest / "ckpt"
    pipe.save_pretrained(str(ckpt), max_shard_size="40KB")
    return ckpt


@pytest.fixture(scope="module")
def fine_tune(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("qwen-fine-tune"))


@pytest.fixture(scope="module")
def pipe(fine_tune):
    from difflet import DiffletPipeline

    with DiffletPipeline.from_pretrained(fine_tune, dtype="float32", store=shared_store_dir(), **SIZE) as p:
        yield p


def _reference(ckpt: Path) -> np.ndarray:
    from diffusers import QwenImagePipeline

    ref = QwenImagePipeline.from_pretrained(str(ckpt))
    ref.set_progress_bar_config(disable=True)
    out = ref(CALL["prompt"], negative_prompt=" ", true_cfg_scale=CALL["guidance"],
              generator=torch.Generator("cpu").manual_seed(CALL["seed"]), height=SIZE["height"],
              width=SIZE["width"], max_sequence_length=SIZE["max_sequence_length"],
              num_inference_steps=CALL["num_inference_steps"], output_type="np")
    return (np.asarray(out.images[0]) * 255).round().astype(np.uint8)


def test_checkpoint_is_sharded(fine_tune):
    for sub in ("transformer", "vae"):
        assert (fine_tune / sub / "diffusion_pytorch_model.safetensors.index.json").is_file()
        assert not (fine_tune / sub / "diffusion_pytorch_model.safetensors").exists()
    assert (fine_tune / "text_encoder" / "model.safetensors.index.json").is_file()


def test_qwen_description_serves_a_checkpoint_of_other_dimensions(pipe, fine_tune):
    module = pipe.runner.module
    assert module.attrs["source"].endswith("qwen-image.dsl")  # found from model_index.json
    transformer, vae = module.component("transformer"), module.component("vae")
    assert transformer.attrs["config"]["num_attention_heads"] == 3  # taken from the checkpoint
    assert [(a.attrs["heads"], a.attrs["head_dim"]) for a in transformer.find(Op.ATTENTION)] == [(3, 8)]
    # 32 / (2 * 2 ** 2) = 4 per side: 16 visual tokens of 12 packed channels (z_dim 3 x 2 x 2)
    assert _shape(transformer, "hidden_states") == _shape(transformer, "sample") == [1, 16, 12]
    assert _shape(transformer, "encoder_hidden_states") == [1, 16, 24]
    assert _shape(module.component("text_encoder"), "prompt_embeds") == [1, 16 + TEMPLATE, 24]
    assert _shape(vae, "z") == [1, 3, 1, 8, 8]
    out = pipe(CALL["prompt"], output_type="np", num_inference_steps=CALL["num_inference_steps"],
               guidance_scale=CALL["guidance"], seed=CALL["seed"])
    ours = (np.asarray(out.images[0]) * 255).round().astype(np.uint8)
    assert ours.shape == (32, 32, 3) and ours.std() > 0
    assert_images_close(ours, _reference(fine_tune), "DiffletPipeline vs QwenImagePipeline")


def test_without_weights_the_real_shapes():
    from difflet.frontend.lower import lower_file
    from difflet.passes.model_facts import tokens

    module = lower_file(str(QWEN))
    transformer = module.component("transformer")
    assert tokens(transformer)["visual"] == 64 * 64 == 4096 and tokens(transformer)["text"] == 512
    assert _shape(transformer, "hidden_states") == _shape(transformer, "sample") == [1, 4096, 64]
    assert _shape(transformer, "encoder_hidden_states") == [1, 512, 3584]
    assert _shape(module.component("text_encoder"), "input_ids") == [1, 546]
    assert _shape(module.component("text_encoder"), "prompt_embeds") == [1, 546, 3584]
    assert [(a.attrs["heads"], a.attrs["head_dim"]) for a in transformer.find(Op.ATTENTION)] == [(24, 128)]
    assert _shape(module.component("vae"), "z") == [1, 16, 1, 128, 128]
    assert _shape(module.component("vae"), "sample") == [1, 3, 1, 1024, 1024]
    assert 20.4e9 < transformer.attrs["params"] < 20.5e9


def _write_configs(root: Path, configs: dict) -> Path:
    for sub, config in configs.items():
        (root / sub).mkdir(parents=True)
        (root / sub / "config.json").write_text(json.dumps(config))
    return root


@pytest.mark.parametrize("nested", [True, False], ids=["text_config", "flat"])
def test_the_real_configs_lower_without_weights_files(tmp_path, nested):
    """Only config.json files are read at lower time: Qwen-Image's own configs (the text encoder's
    as Qwen-Image ships it, flat keys and text_config both, or flat only, as transformers saved
    Qwen2.5-VL before nesting it: the family derives text_config from the top-level keys; the
    VAE's class defaults written out) give the real shapes."""
    from transformers import Qwen2_5_VLConfig

    from difflet.frontend.lower import lower_file

    text = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=128000, rms_norm_eps=1e-6,
                rope_scaling={"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
                rope_theta=1000000.0)
    vision = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                  fullatt_block_indexes=[7, 15, 23, 31], window_size=112)
    encoder = {**Qwen2_5_VLConfig(text_config=text, vision_config=vision).to_dict(), **text}
    if not nested:
        del encoder["text_config"]
    transformer = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                       num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False,
                       axes_dims_rope=[16, 56, 56])
    vae = dict(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
               temperal_downsample=[False, True, True], dropout=0.0)
    root = _write_configs(tmp_path, {"text_encoder": encoder, "transformer": transformer, "vae": vae})
    module = lower_file(str(QWEN), weights=str(root))
    assert ("text_config" in module.component("text_encoder").attrs["config"]) == nested  # derived: not in the IR
    want = lower_file(str(QWEN))
    for comp in ("text_encoder", "transformer", "vae"):
        for node in (*module.component(comp).find(Op.INPUT), *module.component(comp).find(Op.OUTPUT)):
            assert node.results[0].type == want.component(comp).find(node.op, node.name)[0].results[0].type
    transformer = module.component("transformer")
    assert [(a.attrs["heads"], a.attrs["head_dim"]) for a in transformer.find(Op.ATTENTION)] == [(24, 128)]
    assert transformer.attrs["params"] == want.component("transformer").attrs["params"]


def test_shapes_follow_the_configs_without_weights_files(tmp_path):
    """The fine-tune's configs at 64x64: every shape from them (VAE scale 2 ** len(temperal_downsample)
    = 4, 12 packed channels, text width 24, 3 heads of 8)."""
    from transformers import Qwen2_5_VLConfig

    from difflet.frontend.lower import lower_file

    encoder = Qwen2_5_VLConfig(text_config=TEXT, vision_config=VISION).to_dict()
    root = _write_configs(tmp_path, {"text_encoder": encoder, "transformer": dict(TRANSFORMER), "vae": VAE})
    module = lower_file(str(QWEN), {"height": "64", "width": "64", "max_text": "16", "dtype": "float32"},
                        str(root))
    transformer = module.component("transformer")
    assert _shape(transformer, "hidden_states") == _shape(transformer, "sample") == [1, 64, 12]
    assert _shape(transformer, "encoder_hidden_states") == [1, 16, 24]
    assert [(a.attrs["heads"], a.attrs["head_dim"]) for a in transformer.find(Op.ATTENTION)] == [(3, 8)]
    assert _shape(module.component("vae"), "z") == [1, 3, 1, 16, 16]


def test_stated_config_contradicted_by_the_checkpoint_is_located(fine_tune, monkeypatch):
    """qwen-image-tiny.dsl states its configs inline; this checkpoint has other values. The first
    one lowering meets is the text encoder's nested text_config (hidden_size 32 stated, 24 in the
    checkpoint), located at its entry."""
    monkeypatch.chdir(REPO)  # the location holds the path as given
    from click.testing import CliRunner

    from difflet.cli import main

    lines = (REPO / "models" / "qwen-image-tiny.dsl").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "text_config: {" in text)
    col = lines[line - 1].index("text_config") + 1
    r = CliRunner().invoke(main, ["lower", "models/qwen-image-tiny.dsl", "--weights", str(fine_tune)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    head, snippet = r.stderr.strip().split("\n")
    assert re.match(rf"error: models/qwen-image-tiny\.dsl:{line}:{col}: component 'text_encoder': the "
                    r"description states text_config = \{.*'hidden_size': 32, .*\}, the checkpoint's "
                    r"text_encoder/config\.json has \{.*'hidden_size': 24, ", head), head
    assert snippet.strip().startswith("text_config: {")
