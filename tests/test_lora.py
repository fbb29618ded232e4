"""LoRA adapters served as new weights of the same programs, against diffusers' FluxPipeline.

Oracle: `FluxPipeline.from_pretrained(ckpt)` + `load_lora_weights(file)` + `set_adapters(name, scale)`
(PEFT's unfused LoRA layers) on the flux-tiny checkpoint Difflet serves. The adapters are made with
peft on that checkpoint's transformer (random factors, so every targeted layer moves) and saved with
`FluxPipeline.save_lora_weights`, as a trainer saves them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from difflet.errors import DiffletError
from oracle_util import assert_images_close

PROMPT, SEED = "a lighthouse on a cliff at dusk", 3
# "style": every attention and feed-forward linear of both block kinds and the input embedding (which
# the step-cache probe holds), alpha != rank (a scaling of 2); "other": two layer kinds, another rank
ADAPTERS = {"style": dict(r=4, lora_alpha=8, target_modules=["to_q", "to_k", "to_v", "to_out.0", "add_q_proj",
                                                              "to_add_out", "ff.net.2", "proj_mlp", "proj_out",
                                                              "x_embedder"]),
            "other": dict(r=2, lora_alpha=2, target_modules=["proj_mlp", "ff_context.net.0.proj"])}


def _save_adapter(ckpt: Path, dest: Path, seed: int, **config) -> Path:
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    transformer = FluxTransformer2DModel.from_pretrained(str(ckpt / "transformer"))
    lora = LoraConfig(init_lora_weights="gaussian", **config)
    transformer.add_adapter(lora)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # a trained adapter's B is not zero (PEFT initializes it so)
        for name, p in transformer.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    dest.mkdir(parents=True)
    FluxPipeline.save_lora_weights(str(dest), transformer_lora_layers=get_peft_model_state_dict(transformer),
                                   transformer_lora_adapter_metadata=lora.to_dict())
    return dest / "pytorch_lora_weights.safetensors"


@pytest.fixture(scope="module")
def adapters(flux_tiny_ckpt, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loras")
    return {name: _save_adapter(Path(flux_tiny_ckpt), root / name, seed, **config)
            for seed, (name, config) in enumerate(ADAPTERS.items())}


@pytest.fixture(scope="module")
def runner(flux_tiny_art, adapters):
    from difflet.runtime.runner import ModelRunner

    with ModelRunner.from_artifacts(flux_tiny_art) as r:
        r.load_loras([(name, str(path), 1.0) for name, path in adapters.items()])
        yield r


def _reference(ckpt: Path, adapter: Path | None, name: str = "", scale: float = 1.0) -> np.ndarray:
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(str(ckpt))
    pipe.set_progress_bar_config(disable=True)
    if adapter is not None:
        pipe.load_lora_weights(str(adapter), adapter_name=name)
        pipe.set_adapters([name], [scale])
    out = pipe(PROMPT, generator=torch.Generator("cpu").manual_seed(SEED), num_inference_steps=4,
               guidance_scale=3.5, height=32, width=32, max_sequence_length=32, output_type="np")
    return (out.images[0] * 255).round().astype(np.uint8)


def _served(runner, lora: str) -> np.ndarray:
    return runner.generate(runner.resolve(prompt=PROMPT, seed=SEED, lora=lora)).image


@pytest.mark.parametrize("name,scale", [("style", 1.0), ("style", 0.5), ("other", 1.0)])
def test_served_adapter_is_fluxpipelines_load_lora_weights(runner, adapters, flux_tiny_ckpt, name, scale):
    got = _served(runner, f"{name}:{scale}")
    assert_images_close(got, _reference(Path(flux_tiny_ckpt), adapters[name], name, scale),
                        f"{name} at {scale} vs FluxPipeline.load_lora_weights")


def test_an_adapter_changes_the_image_and_switching_back_restores_the_base(runner, flux_tiny_ckpt):
    """The check above can fail: the adapter's image is far from the base one (so a served image
    that ignored the adapter would miss the oracle), and after serving adapters the base weights
    give the base pipeline's image again (merging starts from the checkpoint values every time)."""
    styled = _served(runner, "style")
    base = _served(runner, "")
    assert np.abs(styled.astype(int) - base.astype(int)).max() > 8
    assert_images_close(base, _reference(Path(flux_tiny_ckpt), None), "base after adapters vs FluxPipeline")
    assert np.array_equal(_served(runner, "style:1.0"), styled)  # same merge, same image


def test_an_adapter_not_loaded_is_refused_naming_it(runner):
    with pytest.raises(DiffletError, match=r"lora: adapter 'missing' is not loaded \(loaded: other, style\)"):
        runner.resolve(prompt=PROMPT, lora="missing")
    with pytest.raises(DiffletError, match=r"lora: scale 9.0 is outside \[-8, 8\]"):
        runner.resolve(prompt=PROMPT, lora="style:9")


def test_a_malformed_file_is_refused_naming_the_file_and_its_first_bad_key(runner, adapters, tmp_path):
    from safetensors.torch import load_file, save_file

    from difflet.runtime.lora import read_adapter

    tensors = load_file(str(adapters["style"]))
    first = sorted(tensors)[0]
    bad = tmp_path / "renamed.safetensors"
    renamed = {k.replace("transformer_blocks.0.", "transformer_blocks.7."): v for k, v in tensors.items()}
    save_file(renamed, str(bad))
    with pytest.raises(DiffletError) as err:
        read_adapter("bad", bad, runner.module)
    assert str(bad) in str(err.value) and "transformer_blocks.7." in str(err.value)
    text_encoder = tmp_path / "te.safetensors"
    save_file({"text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(2, 32),
               "text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(32, 2)},
              str(text_encoder))
    with pytest.raises(DiffletError, match="text encoder's weight; only the denoiser's LoRA layers are served"):
        read_adapter("te", text_encoder, runner.module)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    with pytest.raises(DiffletError, match="not a LoRA file"):
        read_adapter("g", garbage, runner.module)
    assert first  # the original file's keys were there to break


def test_eager_programs_and_the_step_cache_probe_take_the_adapter(flux_tiny_ckpt, adapters):
    """Uncompiled programs (the modules codegen compiles) take the same merge, and the step-cache
    probe, which holds the first blocks' weights, takes its part of it: its change score under
    the adapter is the one the probe module built from the merged weights gives."""
    from difflet.codegen.artifacts import eager_programs
    from difflet.codegen.probe import eager_probe
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize
    from difflet.runtime.runner import ModelRunner
    from conftest import FLUX_TINY_DSL

    module = optimize(lower_file(str(FLUX_TINY_DSL)), probe="separate")
    runner = ModelRunner(module, eager_programs(module, flux_tiny_ckpt), flux_tiny_ckpt,
                         probe=eager_probe(module, flux_tiny_ckpt))
    runner.load_loras([("style", str(adapters["style"]), 1.0)])
    probe_targets = [t for t in runner.lora._targets if t.holder.module is runner.probe.program._runner]
    assert probe_targets and 0 < len(probe_targets[0].fqn) < len(runner.lora.adapters["style"].layers["transformer"])
    got = _served(runner, "style:0.5")
    assert_images_close(got, _reference(Path(flux_tiny_ckpt), adapters["style"], "style", 0.5),
                        "eager programs, style at 0.5 vs FluxPipeline.load_lora_weights")
    holder = probe_targets[0].holder.module
    for key, fqn in probe_targets[0].fqn.items():  # the probe serves base + 0.5 * delta
        want = probe_targets[0].holder.read_base(fqn) + 0.5 * runner.lora.adapters["style"].delta("transformer", key)
        assert torch.equal(holder.state_dict()[fqn], want.to(holder.state_dict()[fqn].dtype))


# ---- served by difflet-runtime: gRPC and the OpenAI-compatible HTTP API


@pytest.fixture(scope="module")
def served(flux_tiny_art, adapters):  # the served tests start servers: full suite only
    from difflet.runtime.demo import stop_server
    from http_util import start_http_server

    proc, grpc_address, http_address = start_http_server(
        flux_tiny_art, "--lora", f"style={adapters['style']}", "--lora", f"other={adapters['other']}:0.5")
    yield grpc_address, http_address
    assert stop_server(proc) == 0


def _png(data: bytes) -> np.ndarray:
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.mark.slow
def test_served_over_grpc_and_http_switching_adapters_compiles_nothing(served, adapters, flux_tiny_ckpt):
    import base64

    import openai

    from difflet.runtime import client

    grpc_address, http_address = served
    style = client.generate(grpc_address, PROMPT, SEED, lora="style:0.5", timeout=300)
    assert_images_close(_png(style.png), _reference(Path(flux_tiny_ckpt), adapters["style"], "style", 0.5),
                        "gRPC style:0.5 vs FluxPipeline.load_lora_weights")
    other = client.generate(grpc_address, PROMPT, SEED, lora="other", timeout=300)  # its --lora scale, 0.5
    assert_images_close(_png(other.png), _reference(Path(flux_tiny_ckpt), adapters["other"], "other", 0.5),
                        "gRPC other (loaded at 0.5) vs FluxPipeline.load_lora_weights")
    oai = openai.OpenAI(base_url=f"http://{http_address}/v1", api_key="none-needed", max_retries=0)
    reply = oai.images.generate(prompt=PROMPT, response_format="b64_json", extra_body={"seed": SEED, "lora": "style:0.5"})
    assert np.array_equal(_png(base64.b64decode(reply.data[0].b64_json)), _png(style.png))
    processes = client.get_profile(grpc_address, timeout=30).serving.processes
    assert processes and all(p.compiles == 0 for p in processes)


@pytest.mark.slow
def test_an_adapter_the_server_did_not_load_is_refused_naming_it(served):
    import grpc
    import openai

    from difflet.runtime import client

    grpc_address, http_address = served
    with pytest.raises(grpc.RpcError) as err:
        client.generate(grpc_address, PROMPT, SEED, lora="missing", timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "lora: adapter 'missing' is not loaded (loaded: other, style)"
    oai = openai.OpenAI(base_url=f"http://{http_address}/v1", api_key="none-needed", max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        oai.images.generate(prompt=PROMPT, extra_body={"lora": "missing"})
    assert "lora: adapter 'missing' is not loaded" in str(bad.value)


@pytest.mark.slow
def test_a_malformed_file_stops_the_server_at_start_naming_file_and_key(flux_tiny_art, adapters, tmp_path):
    import subprocess
    import sys

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad.safetensors"
    save_file({k.replace("single_transformer_blocks.1.", "single_transformer_blocks.9."): v
               for k, v in load_file(str(adapters["style"])).items()}, str(bad))
    run = subprocess.run([sys.executable, "-m", "difflet.runtime.server", "--artifacts", str(flux_tiny_art),
                          "--port", "0", "--lora", f"bad={bad}"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    assert str(bad) in run.stderr and "single_transformer_blocks.9." in run.stderr
    assert "Traceback" not in run.stderr
    missing = subprocess.run([sys.executable, "-m", "difflet.runtime.server", "--artifacts", str(flux_tiny_art),
                              "--port", "0", "--lora", f"x={tmp_path / 'none.safetensors'}"],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "none.safetensors: no such file" in missing.stderr


def test_python_api_load_lora_weights_and_set_adapters(flux_tiny_ckpt, adapters):
    from conftest import shared_store_dir
    from difflet import DiffletPipeline

    ckpt = Path(flux_tiny_ckpt)
    with DiffletPipeline.from_pretrained(ckpt, model="flux-tiny", store=shared_store_dir()) as pipe:
        assert pipe.load_lora_weights(adapters["style"], adapter_name="style", scale=0.5) == "style"
        image = (pipe(PROMPT, seed=SEED, output_type="np").images[0] * 255).round().astype(np.uint8)
        assert_images_close(image, _reference(ckpt, adapters["style"], "style", 0.5),
                            "DiffletPipeline.load_lora_weights(scale=0.5) vs FluxPipeline")
        pipe.set_adapters([])
        base = (pipe(PROMPT, seed=SEED, output_type="np").images[0] * 255).round().astype(np.uint8)
        assert_images_close(base, _reference(ckpt, None), "set_adapters([]) vs FluxPipeline")
        with pytest.raises(DiffletError, match="one adapter per call"):
            pipe.set_adapters(["style", "style"])
        with pytest.raises(DiffletError, match="adapter 'nope' is not loaded"):
            pipe.set_adapters("nope")


@pytest.mark.slow  # a second family's pipeline and programs
def test_a_wan_adapter_is_wanpipelines_load_lora_weights(tmp_path):
    """The same generic path on another family: a Wan adapter (self- and cross-attention and the
    FFN) on the wan2.1-tiny eager programs equals WanPipeline.load_lora_weights at scale 0.7."""
    from diffusers import WanPipeline, WanTransformer3DModel
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    from conftest import REPO
    from difflet.codegen.artifacts import eager_programs
    from difflet.runtime.runner import ModelRunner
    from oracle_util import planned_tiny, random_checkpoint

    module = planned_tiny(REPO / "models" / "wan2.1-tiny.dsl")
    ckpt = Path(random_checkpoint(module))
    transformer = WanTransformer3DModel.from_pretrained(str(ckpt / "transformer"))
    lora = LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0", "ffn.net.2"],
                      init_lora_weights="gaussian")
    transformer.add_adapter(lora)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    WanPipeline.save_lora_weights(str(tmp_path), transformer_lora_layers=get_peft_model_state_dict(transformer),
                                  transformer_lora_adapter_metadata=lora.to_dict())
    path = tmp_path / "pytorch_lora_weights.safetensors"
    runner = ModelRunner(module, eager_programs(module, ckpt), ckpt)
    runner.load_loras([("motion", str(path), 0.7)])
    ours = runner.generate(runner.resolve(prompt=PROMPT, seed=SEED, lora="motion")).video
    ref = WanPipeline.from_pretrained(str(ckpt))
    ref.set_progress_bar_config(disable=True)
    ref.load_lora_weights(str(path), adapter_name="motion")
    ref.set_adapters(["motion"], [0.7])
    want = ref(PROMPT, generator=torch.Generator("cpu").manual_seed(SEED), num_inference_steps=4, guidance_scale=5.0,
               height=32, width=32, num_frames=9, max_sequence_length=16, output_type="np").frames[0]
    base = runner.generate(runner.resolve(prompt=PROMPT, seed=SEED)).video
    assert np.abs(base.astype(int) - ours.astype(int)).max() > 8  # the adapter moves the video
    for i, (got, exp) in enumerate(zip(ours, (want * 255).round().astype(np.uint8), strict=True)):
        assert_images_close(got, exp, f"Wan adapter at 0.7, frame {i} vs WanPipeline.load_lora_weights")
