"""The neuron backend's code paths that run without the Neuron SDK.

Oracles: NxD Inference's FLUX app for the per-role flags (neuronx-distributed-inference
src/neuronx_distributed_inference/models/diffusers/flux/{modeling_flux.py, clip/modeling_clip.py,
t5/modeling_t5.py, vae/modeling_vae.py} `get_compiler_args`); the SDK's target lookup
`get_platform_target(compiler_args)` (torch_neuronx.utils, called by neuronx_distributed
trace/functions.py and trace/model_builder.py with the compiler_args; torch-neuronx's source is not
public, so the TEST DOUBLE below follows the Amazon-published copy of that function in aws-neuron's
nkipy sources); the cache key's own inputs (`--explain-key`); the probe module's in-place forward
for the aliased-state form neuron traces, and NxD Inference's KV cache (an `nn.Parameter`,
modules/kvcache/kv_cache_manager.py, aliased in models/model_wrapper.py) for what an alias key is.
A torch_neuronx double records compile_entry's trace call; nothing claims a Neuron program.
"""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from difflet.errors import BackendUnavailable, DiffletError
from difflet.frontend.lower import lower_file
from difflet.ir.nodes import Op
from difflet.passes import cache_key, neuron_flags
from difflet.passes.pipeline import optimize
from difflet.passes.targets import load_target

HAS_SDK = importlib.util.find_spec("torch_neuronx") is not None


@pytest.fixture(scope="module")
def flux_lowered():
    from conftest import FLUX_TINY_DSL

    return lower_file(str(FLUX_TINY_DSL))


def _keys(module) -> dict[str, str]:
    return {c.name: c.attrs["cache_key"] for c in module.components()}


# NxD Inference models/diffusers/flux: modeling_flux.py (backbone), clip/ and t5/modeling_*.py
# (text encoders), vae/modeling_vae.py (VAE) get_compiler_args, as argv tokens, plus the target
# (model_wrapper.py `--target {target}`) and trn2's LNC
NXDI_FLUX = {
    "denoiser": ["--model-type=transformer", "-O1", "--auto-cast=none",
                 "--tensorizer-options=--enable-ccop-compute-overlap"],
    "encoder": ["--model-type=transformer", "-O1", "--auto-cast=none",
                "--tensorizer-options=--enable-ccop-compute-overlap --cc-pipeline-tiling-factor=4"],
    "decoder": ["--model-type=unet-inference", "-O1", "--auto-cast=none"],
}


def test_each_role_gets_nxd_inferences_flux_flags():
    table = load_target("trn2")
    for role, flags in NXDI_FLUX.items():
        args = neuron_flags.role_args(table, role)
        assert args[:3] == ["--target", "trn2", "--lnc=2"] and sorted(args[3:]) == sorted(flags), role
    assert neuron_flags.role_args(table, "probe") == neuron_flags.role_args(table, "denoiser")
    with pytest.raises(DiffletError, match="no flags for component role 'vocoder'"):
        neuron_flags.role_args(table, "vocoder")
    with pytest.raises(DiffletError, match="no neuron_compiler section"):
        neuron_flags.role_args(load_target("cpu"), "denoiser")


SUPPORTED_TYPES = {"trn1", "trn1n", "trn2"}


def get_platform_target_double(compiler_args=None, environ=None):
    """torch_neuronx.utils get_platform_target as Amazon's published copy writes it: the env
    override first; else, if "--target" occurs in compiler_args (substring of a str, member of a
    list), split a str on whitespace and return the token after the "--target" token; else read
    the instance type from /sys (which fails off Trainium: a RuntimeError here)."""
    environ = {} if environ is None else environ
    if "NEURON_PLATFORM_TARGET_OVERRIDE" in environ:
        return environ["NEURON_PLATFORM_TARGET_OVERRIDE"]
    if compiler_args is not None and "--target" in compiler_args:
        if isinstance(compiler_args, str):
            compiler_args = compiler_args.split()
        target = compiler_args[compiler_args.index("--target") + 1]
        assert target in SUPPORTED_TYPES
        return target
    raise RuntimeError("Unable to read platform target (no --target token, not on a Trainium host)")


@pytest.mark.parametrize("role", sorted(NXDI_FLUX))
def test_the_sdks_target_lookup_reads_both_compile_paths_flags(role):
    args = neuron_flags.role_args(load_target("trn2"), role)
    assert get_platform_target_double(args) == "trn2"  # torch_neuronx.trace's list (neuron.compile_entry)
    assert get_platform_target_double(neuron_flags.as_string(args)) == "trn2"  # ModelBuilder's string
    # the string keeps the tensorizer options one shell token, as NxD Inference quotes them
    import shlex

    assert shlex.split(neuron_flags.as_string(args)) == args


def test_the_platform_target_override_is_set_unless_the_user_set_it(monkeypatch):
    import os

    from difflet.codegen.neuron import set_platform_target

    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    set_platform_target()
    assert os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] == "trn2"
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    set_platform_target()
    assert os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] == "trn1"


def _with_table(monkeypatch, **change):
    table = dict(load_target("trn2"))
    cfg = {**table["neuron_compiler"]}
    roles = {r: dict(v) for r, v in cfg["roles"].items()}
    for k, v in change.items():
        if "." in k:
            role, field = k.split(".")
            roles[role][field] = v
        else:
            cfg[k] = v
    table["neuron_compiler"] = {**cfg, "roles": roles}
    monkeypatch.setattr(neuron_flags, "load_target", lambda name: table)


@pytest.mark.parametrize("change", [{"lnc": 1}, {"auto_cast": "matmult"}, {"target": "trn1"},
                                    {"denoiser.optimization_level": 2}, {"decoder.model_type": "transformer"},
                                    {"encoder.tensorizer_options": []}])
def test_each_compiler_flag_changes_every_neuron_cache_key(flux_lowered, monkeypatch, change):
    base = optimize(flux_lowered, "tp1", target="trn2", backend="neuron")
    inductor = optimize(flux_lowered, "tp1", target="cpu", backend="inductor")
    _with_table(monkeypatch, **change)
    changed = optimize(flux_lowered, "tp1", target="trn2", backend="neuron")
    before, after = _keys(base), _keys(changed)
    assert before.keys() == after.keys() and all(before[k] != after[k] for k in before)
    assert _keys(optimize(flux_lowered, "tp1", target="cpu", backend="inductor")) == _keys(inductor)


def test_flags_are_a_named_key_part_for_neuron_only(flux_lowered):
    neuron = json.loads(cache_key.explain(optimize(flux_lowered, "tp1", target="trn2", backend="neuron")))
    part = neuron["transformer"]["inputs"]["neuron_compiler_args"]
    assert sorted(part) == ["decoder", "denoiser", "encoder", "probe"]
    assert part["decoder"] == neuron_flags.role_args(load_target("trn2"), "decoder")
    inductor = json.loads(cache_key.explain(optimize(flux_lowered, "tp1", target="cpu", backend="inductor")))
    assert "neuron_compiler_args" not in inductor["transformer"]["inputs"]


@pytest.mark.skipif(HAS_SDK, reason="the Neuron SDK is installed here")
def test_without_the_sdk_the_backend_stops_with_what_to_install():
    from difflet.codegen.backends import get_backend

    with pytest.raises(BackendUnavailable, match="pip install torch-neuronx") as err:
        get_backend("neuron")
    assert "2.29" in str(err.value)


def test_compile_cache_lives_under_the_store(tmp_path):
    from difflet.codegen.neuron import compile_cache_dir

    dest = tmp_path / "store" / "neuron" / "ab" / ".abcd.x1" / "entry"
    dest.mkdir(parents=True)
    assert compile_cache_dir(dest) == (tmp_path / "store" / "neuron-compile-cache").resolve()


@pytest.fixture(scope="module")
def probe(flux_lowered):
    from oracle_util import random_checkpoint

    from difflet.codegen.probe import build_probe_module, program_view

    planned = optimize(flux_lowered, "tp1", target="cpu", backend="inductor", probe="separate")
    node = planned.find(Op.PROBE)[0]
    from difflet.codegen.build import example_inputs

    return build_probe_module(node, random_checkpoint(planned)), example_inputs(program_view(node))


def test_probe_state_is_an_aliased_output_not_an_in_place_update(probe):
    from difflet.codegen.neuron_state import aliased_program

    pm, args = probe
    pm.prev_feature.normal_(generator=torch.Generator().manual_seed(1))
    start = pm.prev_feature.clone()
    program, aliases, dropped = aliased_program(pm)
    score, feature = program(*args)
    assert torch.equal(pm.prev_feature, start)  # the aliased form never mutates
    assert dropped == [1] and list(aliases.values()) == [1]
    (want,) = pm(*args)  # the in-place form: same score, then the state holds the new feature
    assert torch.equal(score, want) and torch.equal(pm.prev_feature, feature)
    ep = torch.export.export(program, args, strict=False)
    assert not ep.graph_signature.buffers_to_mutate  # nothing an exporter could silently drop
    # the traced module's weights are named as the ART's weights file names them (replace_weights)
    assert program.state_dict().keys() == pm.state_dict().keys()
    state = program.state_dict()
    assert all(state[k].data_ptr() == v.data_ptr() for k, v in pm.state_dict().items())


def test_the_aliased_state_is_a_parameter_the_program_reads(probe):
    """NxD Inference aliases nn.Parameter(requires_grad=False) KV caches (kv_cache_manager.py,
    model_wrapper.py input_output_aliases): the alias key must be one of named_parameters()."""
    from difflet.codegen.neuron_state import aliased_program

    pm, args = probe
    program, aliases, _ = aliased_program(pm)
    params = dict(program.named_parameters())
    (key,) = aliases
    assert isinstance(key, torch.nn.Parameter) and not key.requires_grad and key is params["prev_feature"]
    assert "prev_feature" not in dict(program.named_buffers())
    assert "prev_feature" in dict(pm.named_buffers())  # the eager probe keeps its buffer
    # the program computes from ITS state (what a trace moves to the device), not pm's buffer
    other = torch.randn(key.shape, generator=torch.Generator().manual_seed(2)).to(key.dtype)
    with torch.no_grad():
        saved = pm.prev_feature.detach().clone()
        pm.prev_feature.copy_(other)
        want = pm.compute(*args)[0]  # the eager module's score from state `other`
        pm.prev_feature.copy_(saved)
        program.prev_feature = torch.nn.Parameter(other.clone(), requires_grad=False)
        assert not torch.equal(pm.compute(*args)[0], want)  # pm's own buffer is not `other`
        assert torch.equal(program(*args)[0], want)


class TorchNeuronxDouble:
    """Records neuron.compile_entry's torch_neuronx calls (api-torch-neuronx-trace.rst signature:
    trace(func, example_inputs, *, input_output_aliases, compiler_workdir, compiler_args,
    inline_weights_to_neff)); `trace` checks what the SDK needs of its arguments and returns a
    TorchScript trace of the module so compile_entry's torch.jit.save runs."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def trace(self, func, example_inputs, *, input_output_aliases, compiler_workdir, compiler_args,
              inline_weights_to_neff):
        params = list(func.parameters())
        assert all(any(k is p for p in params) for k in input_output_aliases)  # keys among parameters
        self.calls.append({"args": compiler_args, "aliases": dict(input_output_aliases),
                           "target": get_platform_target_double(compiler_args)})
        return torch.jit.trace(func, example_inputs, check_trace=False)

    def replace_weights(self, traced, weights) -> None:
        self.calls[-1]["replaced"] = sorted(weights)


def test_compile_entry_passes_the_roles_tokens_and_parameter_aliases(flux_lowered, tmp_path, monkeypatch):
    import sys
    import types

    from oracle_util import random_checkpoint

    from difflet.codegen import neuron
    from difflet.codegen.probe import build_probe_module, program_view

    planned = optimize(flux_lowered, "tp1", target="trn2", backend="neuron", probe="separate")
    node = planned.find(Op.PROBE)[0]
    double = TorchNeuronxDouble()
    module = types.ModuleType("torch_neuronx")
    module.trace, module.replace_weights = double.trace, double.replace_weights
    monkeypatch.setitem(sys.modules, "torch_neuronx", module)
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", str(tmp_path / "cc"))
    pm = build_probe_module(node, random_checkpoint(planned))
    neuron.compile_entry(program_view(node), pm, tmp_path)  # the node emit.key_node compiles
    (call,) = double.calls
    assert call["args"] == neuron_flags.role_args(load_target("trn2"), "probe") and call["target"] == "trn2"
    assert list(call["aliases"].values()) == [1] and call["replaced"] == sorted(pm.state_dict())
    import os

    assert os.environ["NEURON_PLATFORM_TARGET_OVERRIDE"] == "trn2"
    assert (tmp_path / neuron.PROGRAM_FILE).is_file()


def test_program_weights_are_the_state_dict_without_shared_storage(probe):
    from difflet.codegen.neuron import program_weights

    pm, _ = probe
    weights = program_weights(pm, None)
    state = pm.state_dict()
    assert weights.keys() == state.keys() and all(torch.equal(weights[k], state[k]) for k in state)
    ptrs = [t.untyped_storage().data_ptr() for t in weights.values() if t.numel()]
    assert len(ptrs) == len(set(ptrs))


def test_stateless_programs_are_traced_unchanged(probe):
    from difflet.codegen.neuron_state import aliased_program

    plain = torch.nn.Linear(2, 2)
    assert aliased_program(plain) == (plain, {}, [])
