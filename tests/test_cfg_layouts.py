"""The CFG-parallel layouts tests/test_cfg_parallel.py does not serve: `tp1cp2+cfg2` (each guidance
pass on its own ring-attention pair), `dp2xtp1+cfg2` (two replicas, each a tp1+cfg2 pair) and a
cfg2 layout with the step-caching probe (calibrated step caching, the probe watching the
conditional pass), each compiled from its plan and served by `difflet-runtime` over gRPC.

Oracle: the TP1 artifact of the same model (the probe layout: TP1 with the same probe) in this
process (ModelRunner, the code the model process runs), same request. The guidance passes run the
same computation on other ranks and the host's CFG formula is shared, so outputs agree under the
closeness rule (oracle_util.assert_images_close; videos as lossless MP4s, which decode to the
generated frames). A negative prompt that did not reach the unconditional group would move the
output far beyond the rule: a custom one must change it. Programs come from the shared test store.
"""
from __future__ import annotations

import io
import threading

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import REPO
from oracle_util import assert_images_close

pytestmark = pytest.mark.slow  # compiles split programs and serves 2-4 rank layouts

PROMPT, NEGATIVE, SEED, STEPS = "a red fox in the snow", "blurry, low quality", 7, 14


@pytest.fixture(scope="module")
def arts(tmp_path_factory, difflet_test_store):
    """(model, parallel, attention, probe) -> ART, compiled on first use (programs from the store)."""
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.driver import codegen
    from difflet.frontend.lower import lower_file
    from difflet.passes.built import reasons
    from difflet.passes.pipeline import optimize
    from difflet.runtime.demo import quiet_libraries

    quiet_libraries()
    root, built = tmp_path_factory.mktemp("cfg-layouts"), {}

    def get(model: str, parallel: str, attention: str | None = None, probe: str = "none"):
        key = (model, parallel, attention, probe)
        if key not in built:
            module = optimize(lower_file(str(REPO / "models" / f"{model}.dsl")), parallel=parallel, target="cpu",
                              backend="inductor", attention=attention, probe=probe)
            assert reasons(module) == [], f"{parallel} of {model} is not built"
            art = root / "-".join(str(k) for k in key)
            codegen(module, str(resolve_weights(module, "random:0", difflet_test_store)), art,
                    store=difflet_test_store, log=lambda *_: None)
            built[key] = art
        return built[key]
    return get


def _frames(result) -> np.ndarray:
    """A reply's (or runner result's) image [H, W, 3] or decoded MP4 frames [F, H, W, 3]."""
    import av
    from PIL import Image

    if not result.mp4:
        return np.asarray(Image.open(io.BytesIO(result.png)).convert("RGB"))
    with av.open(io.BytesIO(result.mp4)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def _tp1(art, requests: list[dict], **runner_kw) -> list:
    from difflet.runtime.runner import ModelRunner

    runner = ModelRunner.from_artifacts(art, **runner_kw)
    try:
        return [runner.generate(runner.resolve(prompt=PROMPT, **r)) for r in requests]
    finally:
        runner.close()


def test_tp1cp2_cfg2_ring_served_equals_tp1(arts):
    """wan2.1-tiny: 4 ranks, cfg groups (0, 2) and (1, 3), each a ring-attention cp2 pair."""
    from difflet.codegen.manifest import read_manifest
    from difflet.runtime import client
    from difflet.runtime.demo import start_server, stop_server

    art = arts("wan2.1-tiny", "tp1cp2+cfg2", "ring")
    entry = read_manifest(art).components["transformer"]
    # the manifest lists the inner layout (one cfg group: a cp2 pair), run as two replicas
    assert (entry.cfg, entry.world, entry.degrees.get("cp"), len(entry.ranks)) == (2, 2, 2, 2)
    proc, address = start_server(art, args=("--lossless-video",))
    try:
        served = [_frames(client.generate(address, PROMPT, SEED, timeout=600, negative_prompt=n))
                  for n in (None, NEGATIVE)]
    finally:
        assert stop_server(proc) == 0
    want = _tp1(arts("wan2.1-tiny", "tp1"), [dict(seed=SEED, negative_prompt=n) for n in (None, NEGATIVE)],
                lossless_video=True)
    for got, ref, what in zip(served, want, ("default negative prompt", "custom negative prompt")):
        assert_images_close(got, _frames(ref), f"wan2.1-tiny tp1cp2+cfg2 ring vs tp1, {what}")
    assert not np.array_equal(served[0], served[1])


def test_dp2xtp1_cfg2_serves_two_replicas_each_equal_to_tp1(arts, tmp_path):
    """qwen-image-tiny: two model processes, each running both passes on its own two ranks. The
    first request is held after each step (DIFFLET_FAULTS hold-steps) until the second one has
    started, so least-in-flight dispatch must give the second to the other replica."""
    from difflet.runtime import client
    from difflet.runtime.demo import start_server, stop_server

    art, hold = arts("qwen-image-tiny", "dp2xtp1+cfg2"), tmp_path / "hold-steps"
    proc, address = start_server(art, args=("--threads", "1"), env={"DIFFLET_FAULTS": f"hold-steps:{hold}"})
    seeds, replies, started = (SEED, SEED + 1), {}, {s: threading.Event() for s in (SEED, SEED + 1)}

    def request(seed: int) -> None:
        for event in client.generate_stream(address, PROMPT, seed, timeout=600, negative_prompt=NEGATIVE):
            if event.HasField("progress"):
                started[seed].set()
            if event.HasField("result"):
                replies[seed] = event.result

    try:
        processes = client.get_profile(address, timeout=30).serving.processes
        assert len(processes) == 2 and {p.state for p in processes} == {"ready"}
        hold.touch()  # after the warm-up: every request now waits after each step while it exists
        threads = [threading.Thread(target=request, args=(s,)) for s in seeds]
        threads[0].start()
        assert started[SEED].wait(300), "the first request made no progress"
        threads[1].start()
        assert started[SEED + 1].wait(300), "the second request made no progress while the first was held"
        hold.unlink()
        for t in threads:
            t.join(600)
    finally:
        hold.unlink(missing_ok=True)
        assert stop_server(proc) == 0
    assert sorted(r.replica for r in replies.values()) == [0, 1]
    want = _tp1(arts("qwen-image-tiny", "tp1"), [dict(seed=s, negative_prompt=NEGATIVE) for s in seeds])
    for seed, ref in zip(seeds, want):
        assert_images_close(_frames(replies[seed]), _frames(ref), f"dp2xtp1+cfg2 replica "
                                                                  f"{replies[seed].replica} vs tp1, seed {seed}")
    assert not np.array_equal(_frames(replies[SEED]), _frames(replies[SEED + 1]))


def _calibrate(art, out) -> dict:
    import json

    from difflet.cli import main

    prompts = out.with_suffix(".txt")
    prompts.write_text("a cat\na house by a lake\n")
    res = CliRunner().invoke(main, ["calibrate", str(art), "--prompts", str(prompts), "--steps", "12",
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


def test_cfg2_with_the_probe_calibrates_and_serves_as_tp1_with_the_probe(arts, tmp_path):
    """qwen-image-tiny tp1+cfg2 --probe separate: the probe is the TP1 plan's (same key), fed the
    conditional pass's inputs. Calibrating either artifact (a file is tied to its artifact's
    denoiser key) gives the same samples; served calibrated (threshold 1e9: every step the window
    allows is cached), the cfg2 artifact caches the same steps with the same probe scores and the
    same image as TP1 with the probe."""
    from difflet.codegen.manifest import read_manifest
    from difflet.runtime import client
    from difflet.runtime.demo import start_server, stop_server

    cfg, tp1 = (arts("qwen-image-tiny", p, probe="separate") for p in ("tp1+cfg2", "tp1"))
    keys = [read_manifest(a).components["probe"].cache_key for a in (cfg, tp1)]
    assert keys[0] == keys[1] and read_manifest(cfg).components["transformer"].cfg == 2
    cal_cfg, cal_tp1 = _calibrate(cfg, tmp_path / "cfg.json"), _calibrate(tp1, tmp_path / "tp1.json")
    for a, b in zip(cal_cfg["samples"], cal_tp1["samples"]):
        np.testing.assert_allclose(a["scores"][1:], b["scores"][1:], rtol=1e-4, atol=1e-7)
    cache = {a: f"calibrated:{tmp_path / name}.json:1e9" for a, name in ((cfg, "cfg"), (tp1, "tp1"))}
    request = dict(seed=SEED, steps=STEPS, negative_prompt=NEGATIVE)
    off, want = _tp1(tp1, [dict(request, cache="off"), dict(request, cache=cache[tp1])])
    assert want.stats["cached_steps"] > 0 and want.stats["probe_calls"] == STEPS
    (got,) = _tp1(cfg, [dict(request, cache=cache[cfg])])
    assert got.stats["schedule"] == want.stats["schedule"]
    np.testing.assert_allclose(got.stats["scores"][1:], want.stats["scores"][1:], rtol=1e-4, atol=1e-7)
    assert_images_close(_frames(got), _frames(want), "cfg2 + probe vs tp1 + probe, calibrated (runner)")
    proc, address = start_server(cfg, args=("--cache", cache[cfg]))
    try:
        reply = client.generate(address, PROMPT, SEED, timeout=600, steps=STEPS, negative_prompt=NEGATIVE)
    finally:
        assert stop_server(proc) == 0
    assert reply.cached_steps == want.stats["cached_steps"], reply.cache
    assert_images_close(_frames(reply), _frames(want), "cfg2 + probe vs tp1 + probe, calibrated (served)")
    assert not np.array_equal(_frames(want), _frames(off))  # the cached steps changed the image
