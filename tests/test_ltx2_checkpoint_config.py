"""models/ltx2.dsl takes every config from the checkpoint, against diffusers' LTX2Pipeline.

Oracle: `LTX2Pipeline.from_pretrained(DIR)` on an LTX-2 checkpoint whose dimensions no description
in models/ states (a Gemma-3 of hidden_size 24 in 2 layers -> 3 x 24 stacked; connectors of 2 x 12
(video) and 3 x 8 (audio) with 4 registers; a transformer of 3 heads x 8 (video) and 2 x 6 (audio)
in 2 layers; a video VAE of patch 4 and two spatio-temporal scalings, 6 latent channels, whose
config.json leaves its compression ratios null (16x spatial, 4x temporal, derived by the ltx2
family as AutoencoderKLLTX2Video computes them); an audio VAE of 3 latent channels x 16 mel bins; a
vocoder of upsample_factors [4, 5]), built from the real diffusers/transformers classes and saved
sharded (index files), and `DiffletPipeline.from_pretrained(DIR)` with no model named, which must
find the family from model_index.json and take every config from that checkpoint.
"""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from conftest import shared_store_dir
from difflet.ir.nodes import Op
from oracle_util import assert_images_close, io_shape as _shape

pytestmark = pytest.mark.slow  # compiles and serves a model: full suite only

REPO = Path(__file__).resolve().parent.parent
LTX2 = REPO / "models" / "ltx2.dsl"
GEMMA_TEXT = dict(vocab_size=1000, hidden_size=24, intermediate_size=30, num_hidden_layers=2, num_attention_heads=3,
                  num_key_value_heads=1, head_dim=8, pad_token_id=0, eos_token_id=1, bos_token_id=2)
GEMMA_VISION = dict(hidden_size=16, intermediate_size=20, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                    patch_size=14)
CONNECTORS = dict(caption_channels=24, text_proj_in_factor=3, video_connector_num_attention_heads=2,
                  video_connector_attention_head_dim=12, video_connector_num_layers=1,
                  video_connector_num_learnable_registers=4, audio_connector_num_attention_heads=3,
                  audio_connector_attention_head_dim=8, audio_connector_num_layers=1,
                  audio_connector_num_learnable_registers=4, connector_rope_base_seq_len=32, rope_type="split")
# cross_attention_dims are the streams' widths (heads x head_dim); audio_in_channels = 3 latent
# channels x 16 // 4 mel bins; the RoPE's vae_scale_factors are the VAE's (temporal, spatial, spatial)
TRANSFORMER = dict(in_channels=6, out_channels=6, patch_size=1, patch_size_t=1, num_attention_heads=3,
                   attention_head_dim=8, cross_attention_dim=24, audio_in_channels=12, audio_out_channels=12,
                   audio_num_attention_heads=2, audio_attention_head_dim=6, audio_cross_attention_dim=12,
                   num_layers=2, caption_channels=24, qk_norm="rms_norm_across_heads", rope_type="split",
                   vae_scale_factors=(4, 16, 16))
VAE = dict(in_channels=3, out_channels=3, latent_channels=6, block_out_channels=(8, 16),
           down_block_types=("LTX2VideoDownBlock3D",) * 2, layers_per_block=(1, 1, 1),
           spatio_temporal_scaling=(True, True), downsample_type=("spatiotemporal", "spatiotemporal"),
           decoder_block_out_channels=(8, 16), decoder_layers_per_block=(1, 1, 1),
           decoder_spatio_temporal_scaling=(True, True), upsample_type=("spatiotemporal", "spatiotemporal"),
           decoder_inject_noise=(False, False, False), upsample_residual=(False, False), upsample_factor=(1, 1),
           timestep_conditioning=False, patch_size=4, patch_size_t=1, encoder_causal=True, decoder_causal=False)
# base_channels: the size of its latents_mean/std, which denormalize the packed [L, channels x bins]
AUDIO_VAE = dict(base_channels=12, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None,
                 in_channels=2, resolution=32, latent_channels=3, norm_type="pixel", causality_axis="height",
                 dropout=0.0, mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True,
                 mel_bins=16)
VOCODER = dict(in_channels=32, hidden_channels=24, out_channels=2, upsample_kernel_sizes=[8, 11],
               upsample_factors=[4, 5], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
               leaky_relu_negative_slope=0.1, output_sampling_rate=8000)
SCHEDULER = dict(use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05, base_image_seq_len=1024,
                 max_image_seq_len=4096, shift_terminal=0.1, shift=1.0)  # the description's
SIZE = dict(height=32, width=64, num_frames=9, max_sequence_length=16)
AUDIO = 9  # LTX2Pipeline's round(9 / 24 fps * 16000 / 160 / 4) audio latent frames
CALL = dict(prompt="a red fox running through the snow", num_inference_steps=2, guidance_scale=3.0, seed=5)
# LTX-2's configs as its diffusers checkpoint states them (the video VAE's from diffusers'
# convert_ltx2_to_diffusers.py: it states the compression ratios its blocks would not give)
GEMMA3_12B_TEXT = dict(vocab_size=262208, hidden_size=3840, intermediate_size=15360, num_hidden_layers=48,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=256)
GEMMA3_12B_VISION = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                         image_size=896, patch_size=14)
REAL = {
    "connectors": dict(caption_channels=3840, text_proj_in_factor=49, video_connector_num_attention_heads=30,
                       video_connector_attention_head_dim=128, audio_connector_num_attention_heads=30,
                       audio_connector_attention_head_dim=128, _class_name="LTX2TextConnectors"),
    "transformer": dict(in_channels=128, out_channels=128, patch_size=1, patch_size_t=1, num_attention_heads=32,
                        attention_head_dim=128, cross_attention_dim=4096, audio_in_channels=128,
                        audio_out_channels=128, audio_num_attention_heads=32, audio_attention_head_dim=64,
                        audio_cross_attention_dim=2048, num_layers=48, caption_channels=3840,
                        qk_norm="rms_norm_across_heads", rope_type="split",
                        _class_name="LTX2VideoTransformer3DModel"),
    "vae": dict(in_channels=3, out_channels=3, latent_channels=128, block_out_channels=[256, 512, 1024, 2048],
                decoder_block_out_channels=[256, 512, 1024], layers_per_block=[4, 6, 6, 2, 2],
                decoder_layers_per_block=[5, 5, 5, 5], spatio_temporal_scaling=[True, True, True, True],
                decoder_spatio_temporal_scaling=[True, True, True], decoder_inject_noise=[False] * 4,
                downsample_type=["spatial", "temporal", "spatiotemporal", "spatiotemporal"],
                upsample_residual=[True, True, True], upsample_factor=[2, 2, 2], timestep_conditioning=False,
                patch_size=4, patch_size_t=1, resnet_norm_eps=1e-6, encoder_causal=True, decoder_causal=False,
                spatial_compression_ratio=32, temporal_compression_ratio=8, _class_name="AutoencoderKLLTX2Video"),
    "audio_vae": dict(base_channels=128, output_channels=2, ch_mult=[1, 2, 4], num_res_blocks=2,
                      attn_resolutions=None, in_channels=2, resolution=256, latent_channels=8, norm_type="pixel",
                      causality_axis="height", dropout=0.0, mid_block_add_attention=False, sample_rate=16000,
                      mel_hop_length=160, is_causal=True, mel_bins=64, _class_name="AutoencoderKLLTX2Audio"),
    "vocoder": dict(in_channels=128, hidden_channels=1024, out_channels=2, upsample_kernel_sizes=[16, 15, 8, 4, 4],
                    upsample_factors=[6, 5, 2, 2, 2], resnet_kernel_sizes=[3, 7, 11],
                    resnet_dilations=[[1, 3, 5]] * 3, output_sampling_rate=24000, _class_name="LTX2Vocoder"),
}


def _build(dest: Path) -> Path:
    """The checkpoint: LTX2Pipeline of freshly initialized classes (random latents_mean/std, which
    the VAEs init to 0/1), save_pretrained with small shards; the word-level Gemma-layout tokenizer
    the tiny LTX-2 checkpoints have (families/ltx2/programs.py write_tokenizer)."""
    from diffusers import (AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler,
                           LTX2Pipeline, LTX2VideoTransformer3DModel)
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, PreTrainedTokenizerFast

    from difflet.families.ltx2.programs import write_tokenizer

    write_tokenizer(None, {"text_config": GEMMA_TEXT}, {"max_length": SIZE["max_sequence_length"]},
                    dest / "tokenizer_src")
    torch.manual_seed(0)
    text_encoder = Gemma3ForConditionalGeneration(Gemma3Config(text_config=GEMMA_TEXT, vision_config=GEMMA_VISION,
                                                               mm_tokens_per_image=4)).eval()
    torch.manual_seed(1)
    connectors = LTX2TextConnectors(**CONNECTORS).eval()
    torch.manual_seed(2)
    transformer = LTX2VideoTransformer3DModel(**TRANSFORMER).eval()
    torch.manual_seed(3)
    vae = AutoencoderKLLTX2Video(**VAE).eval()
    torch.manual_seed(4)
    audio_vae = AutoencoderKLLTX2Audio(**AUDIO_VAE).eval()
    torch.manual_seed(5)
    vocoder = LTX2Vocoder(**VOCODER).eval()
    with torch.no_grad():
        for model in (vae, audio_vae):
            model.latents_mean.normal_(0.0, 0.5)
            model.latents_std.uniform_(0.5, 1.5)
    pipe = LTX2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER), vae=vae, audio_vae=audio_vae,
                        text_encoder=text_encoder,
                        tokenizer=PreTrainedTokenizerFast.from_pretrained(str(dest / "tokenizer_src")),
                        connectors=connectors, transformer=transformer, vocoder=vocoder)
    ckpt = dest / "ckpt"
    pipe.save_pretrained(str(ckpt), max_shard_size="40KB")
    return ckpt


@pytest.fixture(scope="module")
def fine_tune(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("ltx2-fine-tune"))


@pytest.fixture(scope="module")
def pipe(fine_tune):
    from difflet import DiffletPipeline

    # no model name and no audio length: the family derives it from num_frames as LTX2Pipeline does
    with DiffletPipeline.from_pretrained(fine_tune, dtype="float32", store=shared_store_dir(), **SIZE) as p:
        yield p


def _reference(ckpt: Path):
    """CALL's frames (uint8) and waveform from LTX2Pipeline, called as tests/pipeline_oracle.py
    calls it (Difflet serves true CFG + rescale: no STG, no modality guidance)."""
    from diffusers import LTX2Pipeline

    ref = LTX2Pipeline.from_pretrained(str(ckpt))
    ref.set_progress_bar_config(disable=True)
    out = ref(CALL["prompt"], generator=torch.Generator("cpu").manual_seed(CALL["seed"]), height=SIZE["height"],
              width=SIZE["width"], num_frames=SIZE["num_frames"], max_sequence_length=SIZE["max_sequence_length"],
              num_inference_steps=CALL["num_inference_steps"], guidance_scale=CALL["guidance_scale"],
              frame_rate=24.0, output_type="np")
    return (np.asarray(out.frames[0]) * 255).round().astype(np.uint8), out.audio[0].numpy()


def _heads(transformer) -> list[tuple[int, int]]:
    return [(a.attrs["heads"], a.attrs["head_dim"]) for a in transformer.find(Op.ATTENTION)]


def test_checkpoint_is_sharded(fine_tune):
    for sub, name in (("transformer", "diffusion_pytorch_model"), ("text_encoder", "model")):
        assert (fine_tune / sub / f"{name}.safetensors.index.json").is_file()
        assert not (fine_tune / sub / f"{name}.safetensors").exists()
    assert json.loads((fine_tune / "vae" / "config.json").read_text())["spatial_compression_ratio"] is None


def test_ltx2_description_serves_a_checkpoint_of_other_dimensions(pipe, fine_tune):
    module = pipe.runner.module
    assert module.attrs["source"].endswith("ltx2.dsl")  # found from model_index.json
    transformer, vae = module.component("transformer"), module.component("vae")
    assert transformer.attrs["config"]["num_attention_heads"] == 3  # taken from the checkpoint
    assert _heads(transformer) == [(3, 8), (2, 6), (3, 8), (2, 6), (2, 6), (2, 6)]
    tokens = ((9 - 1) // 4 + 1) * (32 // 16) * (64 // 16)  # the pipeline's latents, patch 1
    assert _shape(transformer, "hidden_states") == _shape(transformer, "sample") == [1, tokens, 6]
    assert _shape(transformer, "audio_hidden_states") == _shape(transformer, "audio_sample") == [1, AUDIO, 12]
    assert _shape(transformer, "encoder_hidden_states") == _shape(transformer, "audio_encoder_hidden_states") \
        == [1, 16, 24]
    assert _shape(module.component("text_encoder"), "hidden_states") == [1, 16, 24 * 3]
    assert _shape(module.component("connectors"), "video_text") == [1, 16, 2 * 12]
    assert _shape(module.component("connectors"), "audio_text") == [1, 16, 3 * 8]
    assert _shape(vae, "z") == [1, 6, 3, 2, 4] and _shape(vae, "sample") == [1, 3, 9, 32, 64]
    assert vae.attrs["config"]["spatial_compression_ratio"] is None  # as config.json has it: derived keys stay out
    mel = 4 * AUDIO - 3
    assert _shape(module.component("audio_vae"), "z") == [1, 3, AUDIO, 16 // 4]
    assert _shape(module.component("audio_vae"), "mel") == _shape(module.component("vocoder"), "hidden_states") \
        == [1, 2, mel, 16]
    assert _shape(module.component("vocoder"), "waveform") == [1, 2, 4 * 5 * mel]
    out = pipe(output_type="np", **CALL)
    ours = (out.frames[0] * 255).round().astype(np.uint8)
    assert ours.shape == (9, 32, 64, 3) and ours.std() > 0
    ref, ref_audio = _reference(fine_tune)
    for i, (got, want) in enumerate(zip(ours, ref, strict=True)):
        assert_images_close(got, want, f"frame {i}: DiffletPipeline vs LTX2Pipeline")
    assert ref_audio.shape == (2, 4 * 5 * mel)  # the waveform the vocoder program makes (shape above)
    with av.open(io.BytesIO(out.results[0].mp4)) as container:  # served: muxed as the mp4's AAC track
        assert len(container.streams.video) == 1 and len(container.streams.audio) == 1


def _real_size_shapes(module) -> None:
    from difflet.passes.model_facts import tokens

    transformer = module.component("transformer")
    assert tokens(transformer)["visual"] == 16 * 16 * 24 == 6144 and tokens(transformer)["text"] == 1024
    assert _shape(module.component("text_encoder"), "input_ids") == [1, 1024]
    assert _shape(module.component("text_encoder"), "hidden_states") == [1, 1024, 3840 * 49]
    connectors = module.component("connectors")
    assert _shape(connectors, "text_encoder_hidden_states") == [1, 1024, 188160]
    assert _shape(connectors, "video_text") == _shape(connectors, "audio_text") == [1, 1024, 3840]
    assert _shape(transformer, "hidden_states") == _shape(transformer, "sample") == [1, 6144, 128]
    assert _shape(transformer, "audio_hidden_states") == _shape(transformer, "audio_sample") == [1, 126, 128]
    assert _shape(transformer, "encoder_hidden_states") == _shape(transformer, "audio_encoder_hidden_states") \
        == [1, 1024, 3840]
    assert _shape(transformer, "video_coords") == [1, 3, 6144, 2]
    assert _shape(transformer, "audio_coords") == [1, 1, 126, 2]
    assert _heads(transformer) == [(32, 128), (32, 64), (32, 128), (32, 64), (32, 64), (32, 64)]
    assert _shape(module.component("vae"), "z") == [1, 128, 16, 16, 24]
    assert _shape(module.component("vae"), "sample") == [1, 3, 121, 512, 768]
    assert _shape(module.component("audio_vae"), "z") == [1, 8, 126, 16]
    assert _shape(module.component("audio_vae"), "mel") == _shape(module.component("vocoder"), "hidden_states") \
        == [1, 2, 501, 64]
    assert _shape(module.component("vocoder"), "waveform") == [1, 2, 240 * 501]
    params = {c.name: c.attrs["params"] for c in module.components()}
    assert params == {"text_encoder": 12202563392, "connectors": 1431475200, "transformer": 18876174592,
                      "vae": 1222479601, "audio_vae": 53248146, "vocoder": 55592802}  # LTX-2's 19B, Gemma-3-12B


def test_without_weights_the_real_size_shapes():
    from difflet.frontend.lower import lower_file

    _real_size_shapes(lower_file(str(LTX2)))


def test_the_real_configs_lower_from_config_files_only(tmp_path):
    """Only config.json files are read at lower time: LTX-2's own configs, as transformers and
    diffusers write them, give the real-size shapes; the video VAE's stated ratios (32, 8) win
    over what its blocks would derive (4 * 2 ** 4 = 64, 16)."""
    from transformers import Gemma3Config

    from difflet.families.ltx2.facts import video_vae_derived
    from difflet.frontend.lower import lower_file

    gemma = Gemma3Config(text_config=GEMMA3_12B_TEXT, vision_config=GEMMA3_12B_VISION).to_dict()
    for sub, config in (("text_encoder", gemma), *REAL.items()):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "config.json").write_text(json.dumps(config))
    assert video_vae_derived(REAL["vae"]) == {"spatial_compression_ratio": 64, "temporal_compression_ratio": 16}
    _real_size_shapes(lower_file(str(LTX2), weights=str(tmp_path)))


def test_the_fine_tunes_configs_lower_at_another_size(fine_tune):
    """The fine-tune's configs at another profile size: latents follow the VAE's derived ratios."""
    from difflet.frontend.lower import lower_file

    module = lower_file(str(LTX2), {"height": "64", "width": "32", "frames": "17", "audio": "18", "max_text": "8"},
                        str(fine_tune))
    transformer = module.component("transformer")
    assert _shape(transformer, "hidden_states") == [1, 5 * 4 * 2, 6]
    assert _shape(transformer, "audio_hidden_states") == [1, 18, 12]
    assert _shape(module.component("vae"), "z") == [1, 6, 5, 4, 2]
    assert _shape(module.component("vocoder"), "waveform") == [1, 2, 20 * (4 * 18 - 3)]


def test_derived_keys_are_the_models():
    """The family's derived keys equal what the classes compute: the video VAE's compression ratios
    (this VAE, and the class defaults, on the meta device), the audio decoder's mel frame count and
    the vocoder's samples per mel frame (both run)."""
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    from difflet.families.ltx2.facts import audio_vae_derived, video_vae_derived, vocoder_derived

    for config in (VAE, {}, dict(VAE, spatio_temporal_scaling=True)):
        with torch.device("meta"):
            vae = AutoencoderKLLTX2Video(**config)
        assert video_vae_derived(config) == {"spatial_compression_ratio": vae.spatial_compression_ratio,
                                             "temporal_compression_ratio": vae.temporal_compression_ratio}
    assert video_vae_derived(VAE) == {"spatial_compression_ratio": 16, "temporal_compression_ratio": 4}
    for config in (AUDIO_VAE, dict(AUDIO_VAE, causality_axis="none")):  # "none" trims too
        torch.manual_seed(0)
        audio_vae = AutoencoderKLLTX2Audio(**config).eval()
        derived = audio_vae_derived(config)
        assert derived["temporal_compression_ratio"] == audio_vae.temporal_compression_ratio == 4
        assert derived["mel_compression_ratio"] == audio_vae.mel_compression_ratio == 4
        with torch.no_grad():
            mel = audio_vae.decode(torch.zeros(1, 3, 7, 4), return_dict=False)[0]
        assert mel.shape[2] == 7 * derived["temporal_compression_ratio"] - derived["decoded_frames_trim"]
    torch.manual_seed(0)
    vocoder = LTX2Vocoder(**VOCODER).eval()
    with torch.no_grad():
        wave = vocoder(torch.zeros(1, 2, 11, 16))
    assert wave.shape[-1] == 11 * vocoder_derived(VOCODER)["total_upsample_factor"] == 11 * 20
    with torch.device("meta"):
        default = LTX2Vocoder()
    assert vocoder_derived({})["total_upsample_factor"] == default.total_upsample_factor == 240


def test_stated_config_contradicted_by_the_checkpoint_is_located(fine_tune, monkeypatch):
    """ltx2-tiny.dsl states its configs inline; this checkpoint has other values (the first met:
    the text encoder's text_config, hidden_size 32 there, 24 here)."""
    monkeypatch.chdir(REPO)  # the location holds the path as given
    from click.testing import CliRunner

    from difflet.cli import main

    lines = (REPO / "models" / "ltx2-tiny.dsl").read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if "text_config:" in text)
    col = lines[line - 1].index("text_config") + 1
    r = CliRunner().invoke(main, ["lower", "models/ltx2-tiny.dsl", "--weights", str(fine_tune)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    head, snippet = r.stderr.strip().split("\n")
    assert re.match(rf"error: models/ltx2-tiny\.dsl:{line}:{col}: component 'text_encoder': the description "
                    r"states text_config = \{.*'hidden_size': 32.*\}, the checkpoint's text_encoder/config\.json "
                    r"has \{.*'hidden_size': 24", head), head
    assert snippet.strip().startswith("text_config:")
