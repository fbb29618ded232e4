"""Single-file denoiser checkpoints (issue 28 item 4): a component's weights as one file in its
original layout, converted once into the store by diffusers' `from_single_file`
(difflet/codegen/single_file.py), served through `from_pretrained(DIR, transformer=FILE)` and
`difflet codegen --component-file NAME=FILE`.

FLUX: diffusers 0.42's FLUX converter (single_file_utils.convert_flux_transformer_checkpoint_to_diffusers)
hard-codes inner_dim = 3072 and mlp_ratio 4 for the single blocks' linear1 split, so it converts
only checkpoints of FLUX.1's width; a tiny FLUX in the BFL layout does not convert (torch.split
raises), which the tests below hold as the "file that does not convert" case. The prefix
`model.diffusion_model.` (ComfyUI) is stripped by that converter, so such files take the same path.
The original-layout conversion that does work at tiny sizes is Wan 2.1's (a key rename):
the test writes the tiny Wan transformer in the original layout with a test-side inverse of
diffusers' rename, and first checks it against diffusers' own conversion (the oracle).
The served FLUX image (slow) takes its transformer from a single file in diffusers' layout
(from_single_file loads it unconverted), against FluxPipeline.from_pretrained(DIR); the served Wan
video (slow) takes it from an original-layout, ComfyUI-prefixed file next to a directory whose
transformer/ holds only config.json, against WanPipeline.from_pretrained(DIR).
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import shared_store_dir

REPO = Path(__file__).resolve().parent.parent

# diffusers' Wan names -> the original Wan names (the inverse of convert_wan_transformer_to_diffusers'
# renames for a T2V model); the oracle test checks it against diffusers' conversion.
_WAN_INVERSE = [
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    ("attn1", "self_attn"), ("attn2", "cross_attn"),
    (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."),
    ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"),
    ("norm2", "norm__swap"), ("norm3", "norm2"), ("norm__swap", "norm3"),
]


def _wan_original(state: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in state.items():
        new = key
        for a, b in _WAN_INVERSE:
            new = new.replace(a, b)
        if new == "scale_shift_table":
            new = "head.modulation"
        new = re.sub(r"^blocks\.(\d+)\.scale_shift_table$", r"blocks.\1.modulation", new)
        new = re.sub(r"^proj_out\.", "head.head.", new)
        out[prefix + new] = value.contiguous()
    return out


@pytest.fixture(scope="module")
def wan():
    """(lowered wan2.1-tiny, its random checkpoint DIR, the transformer's state dict)."""
    from diffusers import WanTransformer3DModel

    from difflet.codegen.checkpoint import resolve_weights
    from difflet.frontend.lower import lower_file

    module = lower_file(REPO / "models" / "wan2.1-tiny.dsl")
    ckpt = resolve_weights(module, "random:5", shared_store_dir())
    model = WanTransformer3DModel.from_pretrained(str(ckpt), subfolder="transformer")
    return module, ckpt, model.state_dict()


def _save(state: dict, path: Path) -> Path:
    from safetensors.torch import save_file

    save_file(state, str(path))
    return path


def _config_only(ckpt: Path, sub: str, dest: Path) -> Path:
    """A copy of checkpoint `ckpt` (links) whose `sub`/ holds its config.json and no weights."""
    dest.mkdir()
    for entry in ckpt.iterdir():
        if entry.name != sub:
            (dest / entry.name).symlink_to(entry.resolve())
    (dest / sub).mkdir()
    (dest / sub / "config.json").write_text((ckpt / sub / "config.json").read_text())
    return dest


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."])
def test_wan_original_layout_converts_once_into_the_store(wan, tmp_path, prefix):
    from diffusers import WanTransformer3DModel

    from difflet.codegen.single_file import with_component_files

    module, ckpt, want = wan
    file = _save(_wan_original(want, prefix), tmp_path / "wan_t2v.safetensors")
    assert not any(k.startswith(("condition_embedder", "blocks.0.attn1")) for k in _wan_original(want))
    oracle = WanTransformer3DModel.from_single_file(str(file), config=str(ckpt), subfolder="transformer",
                                                    local_files_only=True)
    assert _same(oracle.state_dict(), want)  # the inverse map is right (diffusers' own conversion)

    store, lines = tmp_path / "store", []
    base = _config_only(ckpt, "transformer", tmp_path / "config-only")  # the file is the only weights
    got = with_component_files(module, str(base), {"transformer": file}, store, log=lines.append)
    assert len(lines) == 1 and lines[0].startswith(f"converting {file} into the store")
    assert (got / "model_index.json").is_file() and (got / "vae" / "config.json").is_file()
    served = WanTransformer3DModel.from_pretrained(str(got), subfolder="transformer")
    assert _same(served.state_dict(), want)
    again = with_component_files(module, str(base), {"transformer": file}, store, log=lines.append)
    assert again == got and len(lines) == 1  # converted once: no second line, the same entry


def _flux_bfl(state: dict) -> dict:
    """diffusers' FLUX names -> Black Forest Labs' (the inverse of diffusers' FLUX converter)."""
    sd, out = dict(state), {}

    def mv(src, dst):
        for s in ("weight", "bias"):
            if f"{src}.{s}" in sd:
                out[f"{dst}.{s}"] = sd.pop(f"{src}.{s}")

    for a, b in (("timestep_embedder", "time_in"), ("text_embedder", "vector_in"), ("guidance_embedder", "guidance_in")):
        mv(f"time_text_embed.{a}.linear_1", f"{b}.in_layer")
        mv(f"time_text_embed.{a}.linear_2", f"{b}.out_layer")
    mv("context_embedder", "txt_in")
    mv("x_embedder", "img_in")
    i = 0
    while f"transformer_blocks.{i}.norm1.linear.weight" in sd:
        p, q = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        mv(p + "norm1.linear", q + "img_mod.lin")
        mv(p + "norm1_context.linear", q + "txt_mod.lin")
        for s in ("weight", "bias"):
            out[q + f"img_attn.qkv.{s}"] = torch.cat([sd.pop(p + f"attn.to_{x}.{s}") for x in "qkv"])
            out[q + f"txt_attn.qkv.{s}"] = torch.cat([sd.pop(p + f"attn.add_{x}_proj.{s}") for x in "qkv"])
        for a, b in (("norm_q", "img_attn.norm.query_norm"), ("norm_k", "img_attn.norm.key_norm"),
                     ("norm_added_q", "txt_attn.norm.query_norm"), ("norm_added_k", "txt_attn.norm.key_norm")):
            out[q + b + ".scale"] = sd.pop(p + f"attn.{a}.weight")
        for a, b in (("ff.net.0.proj", "img_mlp.0"), ("ff.net.2", "img_mlp.2"), ("ff_context.net.0.proj", "txt_mlp.0"),
                     ("ff_context.net.2", "txt_mlp.2"), ("attn.to_out.0", "img_attn.proj"),
                     ("attn.to_add_out", "txt_attn.proj")):
            mv(p + a, q + b)
        i += 1
    i = 0
    while f"single_transformer_blocks.{i}.norm.linear.weight" in sd:
        p, q = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        mv(p + "norm.linear", q + "modulation.lin")
        for s in ("weight", "bias"):
            out[q + f"linear1.{s}"] = torch.cat([sd.pop(p + f"attn.to_{x}.{s}") for x in "qkv"]
                                                + [sd.pop(p + f"proj_mlp.{s}")])
        out[q + "norm.query_norm.scale"] = sd.pop(p + "attn.norm_q.weight")
        out[q + "norm.key_norm.scale"] = sd.pop(p + "attn.norm_k.weight")
        mv(p + "proj_out", q + "linear2")
        i += 1
    mv("proj_out", "final_layer.linear")
    for s in ("weight", "bias"):  # diffusers swaps (shift, scale) -> (scale, shift); its own inverse
        shift, scale = sd.pop(f"norm_out.linear.{s}").chunk(2)
        out[f"final_layer.adaLN_modulation.1.{s}"] = torch.cat([scale, shift])
    assert not sd, sorted(sd)
    return {k: v.contiguous() for k, v in out.items()}


@pytest.fixture(scope="module")
def flux():
    """(the held-out FLUX module, its checkpoint DIR, the transformer's state dict)."""
    from diffusers import FluxTransformer2DModel

    from difflet.codegen.checkpoint import resolve_weights
    from test_flux_heldout import _lowered

    module = _lowered()
    ckpt = resolve_weights(module, "random:7", shared_store_dir())
    model = FluxTransformer2DModel.from_pretrained(str(ckpt), subfolder="transformer")
    return module, ckpt, model.state_dict()


@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."])
def test_tiny_flux_in_the_bfl_layout_does_not_convert_and_says_so(flux, tmp_path, prefix):
    """diffusers converts FLUX.1-width files only (inner_dim 3072 hard-coded): one-line error."""
    from difflet.codegen.single_file import with_component_files
    from difflet.errors import DiffletError

    module, ckpt, want = flux
    bfl = _flux_bfl(want)
    assert "double_blocks.0.img_attn.qkv.weight" in bfl and len(bfl) == len(want) - 8 * 3 - 6 * 1
    file = _save({prefix + k: v for k, v in bfl.items()}, tmp_path / "flux1-tiny.safetensors")
    lines = []
    with pytest.raises(DiffletError) as err:
        with_component_files(module, str(ckpt), {"transformer": file}, tmp_path / "store", log=lines.append)
    assert err.value.where == str(file) and "split" in err.value.message and "\n" not in str(err.value)
    assert len(lines) == 1 and not list((tmp_path / "store" / "single-file").rglob("config.json"))


def test_invalid_component_files(flux, tmp_path):
    from difflet.codegen.single_file import parse_component_files, with_component_files
    from difflet.errors import DiffletError

    module, ckpt, _ = flux
    store = tmp_path / "store"
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a checkpoint at all" * 10)
    cases = [({"transformer": tmp_path / "missing.safetensors"}, "does not exist"),
             ({"transformer": garbage}, "cannot convert garbage.safetensors"),
             ({"text_encoder": garbage}, "has no from_single_file"),  # a transformers class
             ({"unet": garbage}, "not a component of the model"),
             ({"transformer": object()}, "a path to a single file is served")]
    for files, words in cases:
        with pytest.raises(DiffletError) as err:
            with_component_files(module, str(ckpt), files, store, log=lambda *_: None)
        assert words in str(err.value) and "\n" not in str(err.value), str(err.value)
        if isinstance(files.get("transformer"), Path):
            assert str(files["transformer"]) in str(err.value)  # the file is named
    with pytest.raises(DiffletError, match="NAME=PATH"):
        parse_component_files(["transformer"])


def test_cli_component_file_errors_exit_2(flux, tmp_path):
    _, ckpt, _ = flux
    run = [sys.executable, "-m", "difflet.cli"]
    bad = subprocess.run(run + ["lower", str(REPO / "models" / "flux.dsl"), "--weights", str(ckpt), "--component-file", "transformer"],
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "NAME=PATH" in bad.stderr
    missing = subprocess.run(run + ["lower", str(REPO / "models" / "flux.dsl"), "--weights", str(ckpt),
                                    "--component-file", f"transformer={tmp_path / 'x.safetensors'}"],
                             capture_output=True, text=True, cwd=REPO)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "does not exist" in missing.stderr


@pytest.mark.slow  # compiles the held-out FLUX programs (reused when test_flux_heldout ran)
def test_served_flux_with_its_transformer_from_a_single_file(flux, tmp_path):
    from diffusers import FluxPipeline

    from difflet import DiffletPipeline
    from oracle_util import assert_images_close
    from test_flux_heldout import CALL, SIZE

    _, ckpt, want = flux
    file = _save({k: v.contiguous() for k, v in want.items()}, tmp_path / "transformer.safetensors")
    store, lines = shared_store_dir(), []
    kwargs = dict(model="flux", transformer=str(file), dtype="float32", store=store, log=lines.append, **SIZE)
    with DiffletPipeline.from_pretrained(ckpt, **kwargs) as pipe:
        ours = np.asarray(pipe(seed=3, **CALL).images[0])
    assert sum(line.startswith("converting") for line in lines) == 1
    ref = FluxPipeline.from_pretrained(str(ckpt))
    ref.set_progress_bar_config(disable=True)
    want_image = np.asarray(ref(generator=torch.Generator("cpu").manual_seed(3), output_type="pil", **SIZE,
                                **CALL).images[0])
    assert_images_close(ours, want_image, "FLUX with its transformer from a single file vs FluxPipeline(DIR)")
    lines.clear()
    with DiffletPipeline.from_pretrained(ckpt, **kwargs) as pipe:  # the store entry is reused
        assert not any(line.startswith("converting") for line in lines)


@pytest.mark.slow  # serves wan2.1-tiny (its programs are reused when test_model_wan ran)
def test_served_wan_with_its_transformer_from_an_original_layout_file(wan, tmp_path):
    """The original (ComfyUI-prefixed) layout converted by diffusers and served, against WanPipeline(DIR)."""
    from diffusers import WanPipeline

    from difflet import DiffletPipeline
    from oracle_util import assert_images_close
    from test_model_wan import PROMPT, reference_video

    _, ckpt, want = wan
    file = _save(_wan_original(want, "model.diffusion_model."), tmp_path / "wan2.1_t2v.safetensors")
    lines, base = [], _config_only(ckpt, "transformer", tmp_path / "config-only")
    with DiffletPipeline.from_pretrained(base, model="wan2.1-tiny", transformer=file, store=shared_store_dir(),
                                         log=lines.append) as ours:
        frames = np.stack([np.asarray(f) for f in ours(PROMPT, num_inference_steps=2, guidance_scale=3.0,
                                                       seed=9).frames[0]])
        ref_pipe = WanPipeline.from_pretrained(str(ckpt))
        ref_pipe.set_progress_bar_config(disable=True)
        ref = reference_video(ref_pipe, ours.profile, PROMPT, 9, 2, 3.0)
    assert sum(line.startswith("converting") for line in lines) == 1
    assert_images_close(frames, ref, "wan2.1-tiny with its transformer from an original-layout file vs WanPipeline")
