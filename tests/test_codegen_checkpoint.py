"""Random checkpoints load through diffusers like real ones; load_component refuses bad ones."""
import json
import shutil

import pytest

from difflet.codegen.checkpoint import load_component, materialize_checkpoint, resolve_weights
from difflet.errors import DiffletError


def test_flux_pipeline_loads_the_materialized_checkpoint(flux_tiny_module, flux_tiny_ckpt):
    import diffusers
    import transformers

    pipe = diffusers.FluxPipeline.from_pretrained(str(flux_tiny_ckpt))
    assert isinstance(pipe.transformer, diffusers.FluxTransformer2DModel)
    assert isinstance(pipe.vae, diffusers.AutoencoderKL)
    assert isinstance(pipe.text_encoder, transformers.CLIPTextModel)
    assert isinstance(pipe.text_encoder_2, transformers.T5EncoderModel)
    assert pipe.scheduler.config.use_dynamic_shifting and pipe.scheduler.config.max_shift == 1.15
    assert pipe.transformer.config.num_single_layers == 2 and pipe.vae.config.scaling_factor == 0.3611
    # CLIP-style bos ... eos then pad; T5-style ... eos then pad; known caption words are not <unk>.
    clip = pipe.tokenizer("a red circle", padding="max_length", max_length=16).input_ids
    t5 = pipe.tokenizer_2("a red circle", padding="max_length", max_length=32).input_ids
    assert clip[0] == 1 and clip[4] == 2 and clip[5:] == [0] * 11 and len(clip) == 16
    assert t5[:3] == clip[1:4] and t5[3] == 2 and t5[4:] == [0] * 28
    assert pipe.tokenizer.convert_tokens_to_ids("<unk>") not in clip
    assert pipe.tokenizer.model_max_length == 16 and pipe.tokenizer_2.model_max_length == 32


def test_same_seed_same_weights_other_seed_other_weights(flux_tiny_module, flux_tiny_ckpt, tmp_path):
    import torch

    node = flux_tiny_module.component("vae")
    again = materialize_checkpoint(flux_tiny_module, 0, tmp_path / "s0")
    other = materialize_checkpoint(flux_tiny_module, 1, tmp_path / "s1")
    w = {p: load_component(node, p).state_dict() for p in (flux_tiny_ckpt, again, other)}
    key = "decoder.conv_in.weight"
    assert torch.equal(w[flux_tiny_ckpt][key], w[again][key])  # same seeded generator: exact
    assert not torch.equal(w[flux_tiny_ckpt][key], w[other][key])
    assert resolve_weights(flux_tiny_module, "random:0", flux_tiny_ckpt.parent.parent.parent) == flux_tiny_ckpt


def test_missing_component_names_the_path(flux_tiny_module, tmp_path):
    with pytest.raises(DiffletError, match="missing config.json") as err:
        load_component(flux_tiny_module.component("transformer"), tmp_path)
    assert str(tmp_path / "transformer") in str(err.value)


def test_config_disagreeing_with_the_ir_is_refused(flux_tiny_module, flux_tiny_ckpt, tmp_path):
    shutil.copytree(flux_tiny_ckpt / "text_encoder", tmp_path / "text_encoder")
    cfg_path = tmp_path / "text_encoder" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["intermediate_size"] = 64
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(DiffletError, match="intermediate_size is 64 in the checkpoint, 37 in the IR"):
        load_component(flux_tiny_module.component("text_encoder"), tmp_path)


def test_bad_weights_spec_is_a_clear_error(flux_tiny_module, tmp_path):
    with pytest.raises(DiffletError, match="integer seed"):
        resolve_weights(flux_tiny_module, "random:x", tmp_path)
    with pytest.raises(DiffletError, match="does not exist"):
        resolve_weights(flux_tiny_module, str(tmp_path / "nope"), tmp_path)
