"""A real difflet-runtime serving a video family (wan2.1-tiny) with `--calibration wan=FILE --cache
calibrated:wan`.

Oracles: the reply's own counters (denoiser_calls counts full steps, a CFG step's two program
calls once; with an infinite threshold every step but the 5 + 5 kept full is cached) and the same server answering every other cache mode per
request with the programs it loaded (it never compiles: the artifact's files are unchanged).
"""
from __future__ import annotations

import grpc
import pytest
from click.testing import CliRunner

from conftest import REPO
from difflet.cli import main
from difflet.runtime import client as grpc_client
from difflet.runtime.demo import launch_server, read_line, stop_server
from oracle_util import compile_art, random_checkpoint

STEPS = 14


@pytest.fixture(scope="module")
def wan_probe_art(tmp_path_factory):
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    module = optimize(lower_file(str(REPO / "models" / "wan2.1-tiny.dsl")), parallel="tp1", target="cpu",
                      backend="inductor", probe="separate")
    art = compile_art(module, random_checkpoint(module), tmp_path_factory.mktemp("wan-probe-art"))
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts.write_text("a cat\na house by a lake\n")
    cal = tmp_path_factory.mktemp("cal") / "wan.json"
    res = CliRunner().invoke(main, ["calibrate", str(art), "--prompts", str(prompts), "--steps", "12",
                                    "-o", str(cal)])
    assert res.exit_code == 0, res.output
    return art, cal


def _files(root) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def test_server_serves_calibrated_and_every_mode_per_request(wan_probe_art):
    art, cal = wan_probe_art
    before = _files(art)
    proc = launch_server(art, ("--calibration", f"wan={cal}", "--cache", "calibrated:wan"))
    try:
        address = read_line(proc, "listening on ")
        default = grpc_client.generate(address, "a fox in snow", 1, steps=STEPS)
        assert default.cache == "calibrated:wan" and default.frames > 0 and default.mp4
        # a request names a configured calibration, never a file: not even the one configured
        with pytest.raises(grpc.RpcError) as err:
            grpc_client.generate(address, "a fox in snow", 1, steps=STEPS, cache=f"calibrated:{cal}:1e9")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == (f"cache: calibration {str(cal)!r} is not configured on this server "
                                       "(configured: wan); the operator names calibration files with "
                                       "--calibration NAME=FILE")
        loose = grpc_client.generate(address, "a fox in snow", 1, steps=STEPS, cache="calibrated:wan:1e9")
        # threshold 1e9: every step outside the 5 + 5 kept full is cached
        assert (loose.cached_steps, loose.denoiser_calls) == (STEPS - 10, 10)
        # per-request modes on the same programs; cadence:2 at 14 steps caches steps 6 and 8; with
        # keep 2 + 1 cadence 4 computes 0, 1, 2, 6, 10, 13 and caches the other 8
        for mode, cached in (("off", 0), ("cadence:2", 2), ("cadence:4+forecast:1+keep:2:1", 8)):
            reply = grpc_client.generate(address, "a fox in snow", 1, steps=STEPS, cache=mode)
            assert (reply.cache, reply.cached_steps, reply.denoiser_calls) == (mode, cached, STEPS - cached), mode
        delta = grpc_client.generate(address, "a fox in snow", 1, steps=STEPS, cache="online-delta")
    finally:
        assert stop_server(proc) == 0
    assert _files(art) == before  # served from the saved programs, nothing rewritten or compiled
    # online-delta decides from the outputs: the served decisions are the in-process runner's
    from difflet.runtime.runner import ModelRunner

    runner = ModelRunner.from_artifacts(art)
    local = runner.generate(runner.resolve(prompt="a fox in snow", seed=1, steps=STEPS, cache="online-delta"))
    assert (delta.cached_steps, delta.denoiser_calls) == (local.stats["cached_steps"], local.stats["denoiser_calls"])
