"""The neuron backend's code paths that run without the Neuron SDK.

Oracles: the trn2 table's `neuron_compiler` section (data) and the documented neuronx-cc flag
spellings; the cache key's own inputs (`--explain-key`); the probe module's in-place forward (the
inductor program's semantics, tested against the checkpoint in test_stepcache_probe.py) for the
aliased-state form neuron traces. Nothing here imports torch_neuronx: what needs it (tracing,
replace_weights, running) can only be verified on a trn2 host.
"""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from difflet.errors import BackendUnavailable
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


def test_compiler_args_are_the_trn2_tables_flags():
    assert neuron_flags.compiler_args(load_target("trn2")) == [
        "--target=trn2", "--lnc=2", "--model-type=transformer", "-O1", "--auto-cast=none",
        "--enable-saturate-infinity"]
    with pytest.raises(Exception, match="no neuron_compiler section"):
        neuron_flags.compiler_args(load_target("cpu"))


@pytest.mark.parametrize("change", [{"lnc": 1}, {"optimization_level": 2}, {"auto_cast": "matmult"},
                                    {"model_type": "unet-inference"}, {"target": "trn1"}])
def test_each_compiler_flag_changes_every_neuron_cache_key(flux_lowered, monkeypatch, change):
    base = optimize(flux_lowered, "tp1", target="trn2", backend="neuron")
    table = dict(load_target("trn2"))
    table["neuron_compiler"] = {**table["neuron_compiler"], **change}
    monkeypatch.setattr(neuron_flags, "load_target", lambda name: table)
    changed = optimize(flux_lowered, "tp1", target="trn2", backend="neuron")
    before, after = _keys(base), _keys(changed)
    assert before.keys() == after.keys() and all(before[k] != after[k] for k in before)


def test_flags_are_a_named_key_part_for_neuron_only(flux_lowered):
    neuron = json.loads(cache_key.explain(optimize(flux_lowered, "tp1", target="trn2", backend="neuron")))
    assert neuron["transformer"]["inputs"]["neuron_compiler_args"][0] == "--target=trn2"
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
    assert dropped == [1] and list(aliases.values()) == [1] and next(iter(aliases)) is pm.prev_feature
    (want,) = pm(*args)  # the in-place form: same score, then the state holds the new feature
    assert torch.equal(score, want) and torch.equal(pm.prev_feature, feature)
    ep = torch.export.export(program, args, strict=False)
    assert not ep.graph_signature.buffers_to_mutate  # nothing an exporter could silently drop
    # the traced module's weights are named as the ART's weights file names them (replace_weights)
    assert program.state_dict().keys() == pm.state_dict().keys()
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(program.state_dict().values(), pm.state_dict().values()))


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
