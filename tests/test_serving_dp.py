"""Data parallelism as a planned layout (issue 13): a `dp2xtp2` flux-tiny4 artifact is served by
one `difflet-runtime` as two model replicas of two ranks each, chosen by the artifact.

Oracle: the same artifact served with `--replicas 1`. Both serves run the same compiled rank
programs with the same torch thread count (`--threads 1`), so replies must be byte-identical; and
FluxPipeline on the same checkpoint (pipeline_oracle.py), under oracle_util's closeness rule.
"""
from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from difflet.runtime import client
from difflet.runtime.demo import start_server, stop_server
from oracle_util import assert_images_close
from pipeline_oracle import pipeline_output

pytestmark = pytest.mark.slow

FLUX_TINY4 = Path(__file__).resolve().parent.parent / "models" / "flux-tiny4.dsl"
SEEDS = (3, 4, 5, 6)


@pytest.fixture(scope="module")
def art(difflet_test_store, tmp_path_factory):
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.driver import codegen
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    module = optimize(lower_file(str(FLUX_TINY4)), parallel="dp2xtp2", target="cpu",
                      backend="inductor", cores=4)
    ckpt = resolve_weights(module, "random:0", difflet_test_store)
    out = tmp_path_factory.mktemp("flux-tiny4-dp2xtp2")
    codegen(module, str(ckpt), out, store=difflet_test_store, log=lambda *_: None)
    return out


def _serve(art: Path, *args: str) -> tuple[list[bytes], object]:
    proc, address = start_server(art, args=("--threads", "1", *args))
    try:
        profile = client.get_profile(address, timeout=30)
        replies: list = [None] * len(SEEDS)

        def go(i):
            replies[i] = client.generate(address, "a red cube on a checkered floor", SEEDS[i],
                                         steps=3, timeout=300)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(len(SEEDS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        return [r.png for r in replies], profile
    finally:
        assert stop_server(proc) == 0


def _cpus(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for pid {pid}")


def test_dp_layout_builds_one_replica_program(art):
    from difflet.codegen.manifest import read_manifest

    manifest = read_manifest(art)
    assert manifest.parallel["dp"] == 2 and manifest.parallel["world"] == 4
    assert manifest.components["transformer"].world == 2  # one replica's tp2 ranks, built once


def test_dp2xtp2_serves_two_replicas_each_reply_identical_to_one_replica(art):
    one, profile_one = _serve(art, "--replicas", "1")
    proc, address = start_server(art, args=("--threads", "1"))
    try:
        processes = client.get_profile(address, timeout=30).serving.processes
        assert len(processes) == 2 and {p.state for p in processes} == {"ready"}
        assert client.health_status(address) == "SERVING"
        if len(os.sched_getaffinity(0)) >= 2:  # disjoint cores per replica
            cpus = [_cpus(p.pid) for p in processes]
            assert cpus[0] != cpus[1], cpus
    finally:
        assert stop_server(proc) == 0
    two, _ = _serve(art)
    assert len(profile_one.serving.processes) == 1
    for a, b, seed in zip(one, two, SEEDS):
        assert a == b, f"seed {seed}: the 2-replica reply differs from the 1-replica reply"
    for png, seed in zip(two, SEEDS):
        got = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
        assert_images_close(got, pipeline_output("flux-tiny4", "a red cube on a checkered floor", seed, steps=3),
                            f"dp2xtp2 seed {seed} vs FluxPipeline")
