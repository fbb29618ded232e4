"""Compiled flux-tiny programs vs the unsplit diffusers/transformers classes; ART verification; reuse."""
import json
import shutil

import pytest
import torch

from difflet.codegen.artifacts import eager_programs, load_artifacts
from difflet.errors import DiffletError

from flux_oracle import program_and_diffusers_inputs

ATOL = 1e-4


@pytest.fixture(scope="module")
def art(flux_tiny_art):
    return load_artifacts(flux_tiny_art)


def _inputs(program, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for v in program.inputs:
        t = v.type
        if v.is_runtime:
            out.append(torch.tensor(t.hi))
        elif t.dtype == "int64":  # token ids: words, then eos (2), then pad (0)
            ids = torch.zeros(t.shape, dtype=torch.int64)
            ids[0, :5] = torch.randint(4, 1000, (5,), generator=g)
            ids[0, 5] = 2
            out.append(ids)
        else:
            out.append(torch.randn(t.shape, generator=g))
    return tuple(out)


def _reference(name, ckpt, x):
    import diffusers
    import transformers

    with torch.no_grad():
        if name == "transformer":
            ref = diffusers.FluxTransformer2DModel.from_pretrained(str(ckpt), subfolder=name).eval()
            return ref(*x[:-1], return_dict=False)[0]  # no valid_text: diffusers attends all text
        if name == "vae":
            return diffusers.AutoencoderKL.from_pretrained(str(ckpt), subfolder=name).eval().decode(x[0]).sample
        if name == "text_encoder":
            return transformers.CLIPTextModel.from_pretrained(str(ckpt), subfolder=name).eval()(x[0]).pooler_output
        return transformers.T5EncoderModel.from_pretrained(str(ckpt), subfolder=name).eval()(x[0]).last_hidden_state


@pytest.mark.parametrize("name", ["transformer", "vae", "text_encoder", "text_encoder_2"])
def test_compiled_program_equals_its_class(art, flux_tiny_ckpt, name):
    program = art.programs[name]
    x = ref_x = _inputs(program)
    if name == "transformer":  # the host's RoPE tables in, FluxPipeline's position ids to diffusers
        import diffusers
        axes = diffusers.FluxTransformer2DModel.load_config(str(flux_tiny_ckpt), subfolder=name)["axes_dims_rope"]
        x, ref_x = program_and_diffusers_inputs(axes, x)
    (ours,) = program(*x)
    assert ours.shape == tuple(program.outputs[0].type.shape)
    torch.testing.assert_close(ours, _reference(name, flux_tiny_ckpt, ref_x), atol=ATOL, rtol=0)


def test_compiled_denoiser_takes_valid_text_at_run_time(art, flux_tiny_module, flux_tiny_ckpt):
    eager = eager_programs(flux_tiny_module, flux_tiny_ckpt)["transformer"]
    x = _inputs(art.programs["transformer"], seed=1)
    for valid in (1, 7):
        x = (*x[:-1], torch.tensor(valid))
        torch.testing.assert_close(art.programs["transformer"](*x)[0], eager(*x)[0], atol=ATOL, rtol=0)


def test_cpu_program_runs_on_the_loaded_weights_not_a_copy(flux_tiny_art):
    """On CPU a loaded program points at the weight tensors read from the ART (user-managed
    constants), so weights are in memory once: changing one in place changes the output. A
    loader that copied them into the program would give the same output twice."""
    vae = load_artifacts(flux_tiny_art).programs["vae"]
    runner = vae._runner
    x = _inputs(vae)
    before = vae(*x)[0]
    name = next(k for k, t in runner._constants.items() if t.is_floating_point() and t.dim() == 4)
    runner._constants[name].mul_(0.5)
    after = vae(*x)[0]
    assert (after - before).abs().max().item() > 1e-3


def test_split_rank_runner_runs_on_the_loaded_weights_too(flux_tiny_art):
    """The rank workers' GIL-free runner (parallel/aoti_runner.py) attaches weights as the
    CompiledRunner does: on CPU a changed weight changes the output (no copy in the program)."""
    from difflet.parallel.aoti_runner import NoGilRunner

    files = load_artifacts(flux_tiny_art).manifest.components["vae"].ranks[0]
    runner = NoGilRunner(flux_tiny_art / files.program.path, flux_tiny_art / files.weights.path)
    x = _inputs(load_artifacts(flux_tiny_art).programs["vae"])
    before = runner(*x)[0]
    name = next(k for k, t in runner._constants.items() if t.is_floating_point() and t.dim() == 4)
    runner._constants[name].mul_(0.5)
    assert (runner(*x)[0] - before).abs().max().item() > 1e-3


def test_program_refuses_inputs_of_the_wrong_type(art):
    program = art.programs["transformer"]
    x = _inputs(program)
    with pytest.raises(DiffletError, match=r"valid_text must be a 0-d int64 in \[1, 32\]"):
        program(*x[:-1], torch.tensor(33))
    with pytest.raises(DiffletError, match="hidden_states must be float32"):
        program(x[0][:, :5], *x[1:])


def test_manifest_describes_the_art(art, flux_tiny_module):
    from difflet.codegen.manifest import ValueSpec

    m = art.manifest
    assert set(m.components) == {c.name for c in flux_tiny_module.components()} and m.probe is None
    t = m.components["transformer"]
    assert t.cache_key == flux_tiny_module.component("transformer").attrs["cache_key"]
    assert t.role == "denoiser" and t.world == 1
    assert [f.program.path for f in t.ranks] == ["programs/transformer.rank0.pt2"]
    assert t.inputs[-1] == ValueSpec("valid_text", "runtime", "int64", lo=1, hi=32)
    assert [s.step for s in m.schedule][-1] == "flux.decode"
    assert art.module == flux_tiny_module
    assert (art.host_dir / "tokenizer_2" / "tokenizer.json").is_file()
    assert (art.host_dir / "scheduler" / "scheduler_config.json").is_file()


def test_second_codegen_compiles_nothing(flux_tiny_module, flux_tiny_ckpt, difflet_test_store, tmp_path):
    from difflet.codegen.driver import codegen

    lines = []
    result = codegen(flux_tiny_module, str(flux_tiny_ckpt), tmp_path / "art", store=difflet_test_store,
                     log=lines.append)
    assert result.compiled == [] and len(result.reused) == 4
    assert lines[-1] == "compiled 0, reused 4"


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_corrupted_weights_are_refused(flux_tiny_art, tmp_path):
    root = _copy(flux_tiny_art, tmp_path / "art")
    path = root / "weights" / "vae.rank0.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DiffletError, match="weights of 'vae' is corrupt") as err:
        load_artifacts(root)
    assert str(path) in str(err.value)


def test_manifest_with_another_cache_key_is_refused(flux_tiny_art, tmp_path):
    root = _copy(flux_tiny_art, tmp_path / "art")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["components"]["text_encoder"]["cache_key"] = "0" * 64
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DiffletError, match="program of 'text_encoder' was built for cache key 000000"):
        load_artifacts(root)


def test_not_an_art_dir(tmp_path):
    with pytest.raises(DiffletError, match="no manifest.json"):
        load_artifacts(tmp_path)


def _edit(root, change):
    manifest = json.loads((root / "manifest.json").read_text())
    change(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("change,message", [
    (lambda m: m["components"]["vae"].pop("cache_key"),
     r"missing required field `cache_key` - at `\$.components.vae`"),
    (lambda m: m["components"]["vae"]["ranks"][0]["weights"].update(sha256=7),
     r"Expected `str`, got `int` - at `\$.components.vae.ranks\[0\].weights.sha256`"),
    (lambda m: m.update(probe={}), r"contains unknown field `probe`"),
    (lambda m: m["components"]["vae"].update(world=2),
     r"`world` is 2 but `ranks` lists 1 rank files - at `\$.components.vae`"),
])
def test_malformed_manifest_is_refused_naming_the_field(flux_tiny_art, tmp_path, change, message):
    from difflet.runtime.startup import check_artifacts

    root = _copy(flux_tiny_art, tmp_path / "art")
    _edit(root, change)
    for load in (load_artifacts, check_artifacts):  # the model process and the API process
        with pytest.raises(DiffletError, match="manifest is malformed: (Object )?" + message) as err:
            load(root)
        assert err.value.where == root / "manifest.json"


def test_manifest_of_another_format_version_is_refused(flux_tiny_art, tmp_path):
    root = _copy(flux_tiny_art, tmp_path / "art")
    _edit(root, lambda m: m.update(format=1))
    with pytest.raises(DiffletError, match=r"manifest format 1 is not 5 .*re-run `difflet codegen`"):
        load_artifacts(root)
    (root / "manifest.json").write_text("[1, 2]")
    with pytest.raises(DiffletError, match="manifest is not a JSON object"):
        load_artifacts(root)


def test_manifest_module_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys, difflet.codegen.manifest, difflet.codegen.artifacts, difflet.runtime.startup; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_compile_builds_outside_inductors_shared_cache(tmp_path, monkeypatch):
    """Two processes compiling the same code (the ranks of one TP layout) once raced in
    inductor's shared cache directory: one zipped the other's half-written metadata file (CI:
    'parse error ... empty input' at load). Now no file the package is zipped from lies in
    the shared cache, and the package still loads and computes the module."""
    import zipfile

    from torch._inductor.package import load_package

    from difflet.codegen.inductor import aoti_package

    cache = tmp_path / "inductor-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU()).eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        ep = torch.export.export(module, (x,), strict=False)
    aoti_package(ep, tmp_path / "m.pt2")
    packaged = {name.rsplit("/", 1)[-1] for name in zipfile.ZipFile(tmp_path / "m.pt2").namelist()}
    assert any(name.endswith(".wrapper.so") for name in packaged)
    assert [p.name for p in cache.rglob("*") if p.name in packaged] == []
    loaded = load_package(str(tmp_path / "m.pt2"))
    loaded.load_constants({k: v.detach() for k, v in module.state_dict().items()},
                          check_full_update=True, user_managed=True)
    torch.testing.assert_close(loaded(x), module(x), atol=1e-6, rtol=0)
