"""The NeuronCore placement plan (difflet/codegen/neuron_placement.py) and the model-process hook.

Oracles: the component set and worlds of the real planned modules (models/flux.dsl at tp4,
flux-tiny at tp2 / dp2xtp2, through the torch-free passes), core counts from the target table
(trn2.json: cores_per_device 4 at LNC=2; a trn2.3xlarge is one chip, paper section 2 and its
experiments section: four logical cores) and the documented NEURON_RT_VISIBLE_CORES syntax
(aws-neuron-sdk v2.29.1 neuron-runtime/nrt-configurable-parameters.rst: an index or inclusive range).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from difflet.codegen.manifest import FORMAT_VERSION, Component, FileRef, RankFiles
from difflet.codegen.neuron_placement import (PLACEMENT_ENV, VISIBLE_ENV, instance_cores, parse_visible, plan,
                                              slot_of)
from difflet.errors import DiffletError
from difflet.frontend.lower import lower_file
from difflet.ir.nodes import Op
from difflet.passes.layout_attrs import Layout
from difflet.passes.pipeline import optimize
from difflet.passes.targets import load_target

REPO = Path(__file__).resolve().parent.parent
TRN2 = load_target("trn2")
TRN2_3XL = TRN2["cores_per_device"]  # one chip: 4 logical cores at LNC=2


def _ref(path: str) -> FileRef:
    return FileRef(path, "0" * 64)


def components(dsl: str, layout: str) -> dict[str, Component]:
    """Manifest entries shaped as codegen writes them, for the planned module's components."""
    m = optimize(lower_file(str(REPO / "models" / dsl)), layout, target="trn2", backend="neuron")
    out = {}
    for c in (n for n in m.body if n.op == Op.COMPONENT):
        world = Layout.of(c.find(Op.LAYOUT)[0]).replica_world if c.find(Op.LAYOUT) else 1
        ranks = tuple(RankFiles(_ref(f"programs/{c.name}.rank{r}.pt2" if world > 1 else f"programs/{c.name}.pt"),
                                _ref(f"weights/{c.name}.rank{r}.safetensors")) for r in range(world))
        out[c.name] = Component(c.attrs["role"], "x", "k", ranks, (), (), world=world)
    return out


def _cores(p, name) -> set[int]:
    return set(p.absolute(name))


def test_tiny_flux_tp2_on_one_chip_keeps_the_encoders_and_vae_off_the_transformer_ranks():
    comps = components("flux-tiny.dsl", "tp2")
    assert comps["transformer"].world == 2 and {c.world for n, c in comps.items() if n != "transformer"} == {1}
    (p,) = plan(comps, 0, TRN2_3XL)
    den = _cores(p, "transformer")
    assert den == {0, 1} and p.slot("transformer").start == 0  # NxD local ranks on the first visible cores
    others = {n: _cores(p, n) for n in comps if n != "transformer"}
    assert all(len(c) == 1 and c <= {2, 3} for c in others.values()), others  # spare cores only
    assert not p.shared and p.visible_cores() == "0-3"
    env = json.loads(p.env()[PLACEMENT_ENV])
    assert env["programs/transformer.rank0.pt2"] == env["programs/transformer.rank1.pt2"] == [0, 2]
    assert env["programs/vae.pt"][1] == 1


def test_real_flux_tp4_disjoint_on_two_chips_and_explicitly_shared_on_a_trn2_3xlarge():
    comps = components("flux.dsl", "tp4")
    assert comps["transformer"].world == 4
    singles = [n for n, c in comps.items() if c.world == 1]
    (wide,) = plan(comps, 0, 2 * TRN2_3XL)
    ranges = [_cores(wide, n) for n in comps]
    assert sum(map(len, ranges)) == len(set().union(*ranges)) == 4 + len(singles)  # pairwise disjoint
    assert not wide.shared and wide.visible_cores() == f"0-{3 + len(singles)}"
    # 4 cores, TP4: no spare core exists, so tp1 programs sit on named denoiser cores (paper section 6)
    (small,) = plan(comps, 0, TRN2_3XL)
    assert small.shared and small.cores == 4 and _cores(small, "transformer") == {0, 1, 2, 3}
    placed = [small.slot(n).start for n in singles]
    assert placed == [3, 2, 1][:len(singles)]  # deterministic, one core each, never left to round-robin


def test_dp_replicas_get_disjoint_core_ranges():
    comps = components("flux-tiny.dsl", "dp2xtp2")
    plans = plan(comps, 0, 2 * TRN2_3XL, replicas=2)
    a, b = ({c for n in comps for c in _cores(p, n)} for p in plans)
    assert not a & b and plans[1].first == plans[0].first + plans[0].cores
    assert [p.visible_cores() for p in plans] == ["0-3", "4-7"]
    assert all(not p.shared for p in plans)
    tight = plan(comps, 0, TRN2_3XL, replicas=2)  # 2 cores per replica: replicas still apart
    assert [p.visible_cores() for p in tight] == ["0-1", "2-3"]


@pytest.mark.parametrize("dsl,layout,count,replicas", [("flux.dsl", "tp4", TRN2_3XL, 2),
                                                       ("flux-tiny.dsl", "tp2", 1, 1)])
def test_over_subscription_is_refused_naming_the_components(dsl, layout, count, replicas):
    with pytest.raises(DiffletError, match=r"needs .* NeuronCores \(transformer: .* ranks; text_encoder") as e:
        plan(components(dsl, layout), 0, count, replicas=replicas)
    assert "vae" in str(e.value) and f"has {count}" in str(e.value)


def test_instance_cores_from_the_environment_or_the_devices(tmp_path):
    assert parse_visible("4-7") == (4, 4) and parse_visible("2") == (2, 1)
    for bad in ("0,2", "3-1", "a"):
        with pytest.raises(DiffletError, match="not a NeuronCore index"):
            parse_visible(bad)
    assert instance_cores(TRN2, {VISIBLE_ENV: "8-15"}, tmp_path) == (8, 8)
    for d in ("neuron0", "neuron1", "neuronx"):
        (tmp_path / d).touch()
    assert instance_cores(TRN2, {}, tmp_path) == (0, 2 * TRN2["cores_per_device"])
    assert instance_cores(TRN2, {VISIBLE_ENV: "0-127"}, tmp_path) == (0, TRN2["max_cores"])
    with pytest.raises(DiffletError, match="NEURON_RT_VISIBLE_CORES"):
        instance_cores(TRN2, {"NEURON_RT_NUM_CORES": "2"}, tmp_path)


def test_slot_of_reads_the_process_placement(tmp_path):
    env = {PLACEMENT_ENV: json.dumps({"programs/vae.pt": [3, 1]})}
    assert slot_of(tmp_path / "programs" / "vae.pt", env) == (3, 1)
    with pytest.raises(DiffletError, match="no NeuronCore"):
        slot_of(tmp_path / "programs" / "other.pt", env)


def test_the_model_process_sets_its_replicas_cores_before_loading(tmp_path, monkeypatch):
    """The hook (runtime/model_process.serve -> place_process) on a neuron manifest, replica 1 of 2."""
    import msgspec

    from difflet.codegen import neuron_placement
    from difflet.codegen.manifest import MANIFEST, Manifest, Versions, write_manifest

    comps = components("flux-tiny.dsl", "dp2xtp2")
    m = Manifest(format=FORMAT_VERSION, model="m", family="flux", profile={}, parallel={"dp": 2}, target="trn2", backend="neuron",
                 versions=Versions("t", "d"), module=_ref("module.ir"), host="host", host_files={},
                 weights_source="w", components=comps)
    write_manifest(tmp_path, m)
    monkeypatch.setattr(neuron_placement, "instance_cores", lambda target, environ, dev: (0, 8))
    env: dict = {}
    mine = neuron_placement.place_process({"root": str(tmp_path), "replica": 1, "replicas": 2}, env)
    assert env[VISIBLE_ENV] == "4-7" == mine.visible_cores()
    assert json.loads(env[PLACEMENT_ENV])["programs/transformer.rank1.pt2"] == [0, 2]
    other = msgspec.structs.replace(m, backend="inductor")
    write_manifest(tmp_path, other)
    assert neuron_placement.place_process({"root": str(tmp_path)}, env := {}) is None and env == {}
    assert (tmp_path / MANIFEST).is_file()


def test_a_model_process_sets_its_placement_before_it_loads(tmp_path, monkeypatch):
    """runtime/model_process.serve runs the hook before loading: a forked model process, its load
    replaced by a probe that reports the environment it found (over the real pipe protocol)."""
    import multiprocessing

    from difflet.codegen import neuron_placement
    from difflet.codegen.manifest import Manifest, Versions, write_manifest
    from difflet.runtime import messages as msg
    from difflet.runtime import model_process

    write_manifest(tmp_path, Manifest(
        format=FORMAT_VERSION, model="m", family="flux", profile={}, parallel={"dp": 2}, target="trn2", backend="neuron",
        versions=Versions("t", "d"), module=_ref("module.ir"), host="host", host_files={}, weights_source="w",
        components=components("flux-tiny.dsl", "dp2xtp2")))
    monkeypatch.setattr(neuron_placement, "instance_cores", lambda target, environ, dev: (0, 8))
    monkeypatch.delenv(VISIBLE_ENV, raising=False)

    def probe(config):
        import os

        raise DiffletError(f"{os.environ.get(VISIBLE_ENV)} {os.environ.get(PLACEMENT_ENV)}")

    monkeypatch.setattr(model_process, "_load", probe)
    ctx = multiprocessing.get_context("fork")
    conn, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=model_process.serve, args=(child, {"root": str(tmp_path), "cache": "off",
                                                                  "replica": 1, "replicas": 2}))
    proc.start()
    try:
        assert conn.poll(120)
        reply = msg.decode_to_api(conn.recv_bytes())
    finally:
        proc.join(30)
    visible, placement = reply.message.split(" ", 1)
    assert isinstance(reply, msg.Failed) and visible == "4-7"
    assert json.loads(placement)["programs/vae.pt"][1] == 1
