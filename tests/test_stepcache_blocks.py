"""Block mode: the host session on a toy runner (exact decisions and outputs), and a compiled
flux-tiny artifact built with --front-blocks served through difflet-runtime.

Oracles: for the toy, the definition in difflet/stepcache/blocks.py worked by hand (the rest
runs exactly on the steps whose front change reaches the threshold; a cached step's output is
the front's tail on the last or forecast residual); for the artifact, the unsplit artifact of
the same checkpoint (its images) and the server's own counters.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from difflet.codegen.block_programs import BlockRunner
from difflet.stepcache.blocks import BlockSession, active
from difflet.stepcache.controller import StepCache
from difflet.stepcache.modes import parse_mode


class ToyParts:
    """front(x, r) = (s + r, s) with s = the step's scripted stream; rest(x, s) = (3 s, 2 s):
    a full output is 3 s and its residual 2 s, so a cached output is s + the estimated residual."""

    def __init__(self, streams: list[float]) -> None:
        self.streams, self.step, self.rest_steps = streams, 0, []

    def front(self, x, r):
        s = torch.full((2,), self.streams[self.step])
        return (s + r, s)

    def rest(self, x, s):
        self.rest_steps.append(self.step)
        return (3 * s, 2 * s)


def _run(mode: str, streams: list[float]):
    toy = ToyParts(streams)
    runner = BlockRunner(toy.front, toy.rest, 1, ("h",), ("h",), [((2,), "float32")])
    session = BlockSession(StepCache(parse_mode(mode), len(streams)))
    outs = []
    with active(session):
        for i in range(len(streams)):
            toy.step = i
            session.begin(i)
            outs.append(float(runner(torch.zeros(1))[0][0]))
    return toy.rest_steps, outs, session


def test_rest_runs_exactly_when_the_front_change_reaches_the_threshold():
    # keep 1 + 1: step 0 and the last step are full; changes since the last rest run:
    # step 1: |1.05-1|/1 = 0.05 < 0.1 cached; step 2: 0.12 >= 0.1 full; step 3: |1.2-1.12|/1.12 cached
    streams = [1.0, 1.05, 1.12, 1.2, 2.0, 2.0]
    rest, outs, session = _run("block:0.1+keep:1:1", streams)
    assert rest == [0, 2, 4, 5]
    assert session.cache.schedule == [False, True, False, True, False, False]
    # full: 3 s; cached: s + the residual of the last rest run (2 x its stream)
    assert outs == pytest.approx([3.0, 1.05 + 2.0, 3 * 1.12, 1.2 + 2 * 1.12, 6.0, 6.0])
    assert (session.front_calls, session.rest_calls) == (6, 4)


def test_forecast_extrapolates_the_residual():
    # residuals 2 s at steps 0 and 1 (s = 1, 2): the line through them gives 2 * 3 = 6 at step 2
    streams = [1.0, 2.0, 2.0, 2.0]
    rest, outs, _ = _run("block:10+forecast:1+keep:2:1", streams)
    assert rest == [0, 1, 3]
    assert outs[2] == pytest.approx(2.0 + 6.0)
    rest, outs, _ = _run("block:10+keep:2:1", streams)  # without forecast: the last residual, 4
    assert outs[2] == pytest.approx(2.0 + 4.0)


def test_outside_a_session_the_runner_is_the_whole_denoiser():
    toy = ToyParts([5.0])
    runner = BlockRunner(toy.front, toy.rest, 1, ("h",), ("h",), [((2,), "float32")])
    assert float(runner(torch.zeros(1))[0][0]) == 15.0 and toy.rest_steps == [0]


STEPS = 14


@pytest.fixture(scope="module")
def flux_arts(tmp_path_factory):
    """(block-mode artifact cut after block 1, the unsplit artifact) of one flux-tiny checkpoint."""
    from conftest import REPO
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize
    from oracle_util import compile_art, random_checkpoint

    dsl = lower_file(str(REPO / "models" / "flux-tiny.dsl"))
    cut = optimize(dsl, parallel="tp1", target="cpu", backend="inductor", front_blocks=1)
    whole = optimize(dsl, parallel="tp1", target="cpu", backend="inductor")
    ckpt = random_checkpoint(whole)
    return (compile_art(cut, ckpt, tmp_path_factory.mktemp("flux-blocks-art")),
            compile_art(whole, ckpt, tmp_path_factory.mktemp("flux-whole-art")))


def _files(root) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def _png(reply):
    import io

    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(reply.png)).convert("RGB"))


@pytest.mark.slow
def test_block_artifact_loads_each_weight_once_and_equals_the_whole(flux_arts):
    from difflet.codegen.artifacts import load_artifacts
    from difflet.codegen.build import example_inputs

    cut, whole = flux_arts
    art = load_artifacts(cut)
    name = next(n for n, c in art.manifest.components.items() if c.parts)
    runner = art.programs[name]._runner
    front, rest = runner._front._constants, runner._rest._constants
    shared = set(front) & set(rest)
    assert shared and all(front[k].data_ptr() == rest[k].data_ptr() for k in shared)  # one copy in memory
    assert not any(".transformer_blocks.0." in f".{k}" for k in rest)  # block 0 is the front's alone
    x = example_inputs(art.module.component(name))
    got, want = art.programs[name](*x), load_artifacts(whole).programs[name](*x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5)  # fp32: only the residual add's rounding


@pytest.mark.slow
def test_server_serves_block_mode_per_request(flux_arts):
    import grpc

    from difflet.runtime import client as grpc_client
    from difflet.runtime.demo import launch_server, read_line, stop_server
    from difflet.runtime.runner import ModelRunner
    from oracle_util import assert_images_close

    cut, whole = flux_arts
    local = ModelRunner.from_artifacts(whole)
    want = local.generate(local.resolve(prompt="a fox in snow", seed=1, steps=STEPS)).image
    before = _files(cut)
    proc = launch_server(cut, ())
    try:
        address = read_line(proc, "listening on ")
        off = grpc_client.generate(address, "a fox in snow", 1, steps=STEPS)
        assert_images_close(_png(off), want, "off on the block artifact vs the whole artifact")
        # a threshold no change reaches: every step outside the 5 + 5 kept full is cached
        loose = grpc_client.generate(address, "a fox in snow", 1, steps=STEPS, cache="block:10")
        assert (loose.cache, loose.cached_steps, loose.denoiser_calls) == ("block:10", STEPS - 10, 10)
        tight = grpc_client.generate(address, "a fox in snow", 1, steps=STEPS, cache="block:1e-9+keep:1:1")
        assert (tight.cached_steps, tight.denoiser_calls) == (0, STEPS)  # nothing cached: the whole image
        assert_images_close(_png(tight), want, "block mode that caches nothing vs the whole artifact")
        cadence = grpc_client.generate(address, "a fox in snow", 1, steps=STEPS, cache="cadence:2")
        assert (cadence.cached_steps, cadence.denoiser_calls) == (2, STEPS - 2)
    finally:
        assert stop_server(proc) == 0
    assert _files(cut) == before  # every mode per request on the loaded programs: nothing compiled
    proc = launch_server(whole, ())
    try:
        address = read_line(proc, "listening on ")
        with pytest.raises(grpc.RpcError) as err:
            grpc_client.generate(address, "a fox in snow", 1, steps=STEPS, cache="block:0.1")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith("cache: block caching needs a denoiser built as front and rest "
                                              "programs, and this artifact has none (it serves off, cadence:N")
    finally:
        assert stop_server(proc) == 0


@pytest.mark.slow
def test_block_mode_on_a_cfg_video_family(tmp_path_factory):
    """wan2.1-tiny (true CFG: two denoiser calls a step, each with its own residuals; a 5-d latent
    the model patches itself) cut after its first block, against its unsplit artifact."""
    from conftest import REPO
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize
    from difflet.runtime.runner import ModelRunner
    from oracle_util import compile_art, random_checkpoint

    dsl = lower_file(str(REPO / "models" / "wan2.1-tiny.dsl"))
    whole = optimize(dsl, parallel="tp1", target="cpu", backend="inductor")
    ckpt = random_checkpoint(whole)
    cut = ModelRunner.from_artifacts(compile_art(optimize(dsl, parallel="tp1", target="cpu", backend="inductor",
                                                          front_blocks=1), ckpt, tmp_path_factory.mktemp("wan-cut")))
    ref = ModelRunner.from_artifacts(compile_art(whole, ckpt, tmp_path_factory.mktemp("wan-whole")))
    try:
        want = ref.generate(ref.resolve(prompt="a fox", seed=3, steps=STEPS)).video
        tight = cut.generate(cut.resolve(prompt="a fox", seed=3, steps=STEPS, cache="block:1e-9+keep:1:1"))
        assert (tight.stats["front_calls"], tight.stats["rest_calls"]) == (2 * STEPS, 2 * STEPS)
        # both passes of every step ran front and rest: the video is the unsplit artifact's; its
        # uint8 frames may differ by a rounding step where fp32 residual add/subtract moved a value
        assert np.abs(tight.video.astype(int) - want.astype(int)).max() <= 1
        loose = cut.generate(cut.resolve(prompt="a fox", seed=3, steps=STEPS, cache="block:10"))
        assert (loose.stats["cached_steps"], loose.stats["rest_calls"]) == (STEPS - 10, 2 * 10)
        assert loose.stats["front_calls"] == 2 * STEPS
    finally:
        cut.close()
        ref.close()


def test_front_blocks_is_planned_keyed_and_refused_where_not_built():
    from conftest import REPO
    from difflet.errors import DiffletError
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    dsl = lower_file(str(REPO / "models" / "flux-tiny4.dsl"))

    def key(k: int) -> str:
        planned = optimize(dsl, parallel="tp1", target="cpu", backend="inductor", front_blocks=k)
        den = next(c for c in planned.components() if c.attrs.get("role") == "denoiser")
        assert den.attrs.get("front_blocks", 0) == k
        return den.attrs["cache_key"]

    assert len({key(0), key(1), key(2)}) == 3  # a cut never reuses another cut's programs
    with pytest.raises(DiffletError, match=r"--front-blocks 1: block programs of split layouts are built for "
                                           r"tp alone so far \(no sp, cp or cfg\) \(component transformer\)") as err:
        optimize(dsl, parallel="tp2+sp", target="cpu", backend="inductor", front_blocks=1)
    assert err.value.where == "--front-blocks"
    with pytest.raises(DiffletError, match=r"block programs are built for the inductor backends only so far, "
                                           r"not neuron"):
        optimize(dsl, parallel="tp1", target="trn2", backend="neuron", front_blocks=1)


@pytest.mark.slow
def test_block_mode_on_a_tp2_layout(flux_arts, tmp_path_factory):
    """flux-tiny at tp2 cut after its first block: one group of rank workers runs both parts
    (each rank loads its one weights file once) and equals the unsplit tp1 denoiser; a block-mode
    request on it skips exactly what the tp1 block artifact skips (flux_arts: the same checkpoint's
    tp1 cut and unsplit artifacts, so only the tp2 parts compile here).

    Tolerance: TP reorders the row-parallel sums (fp32), 1e-4 as tests/test_split_flux.py."""
    from conftest import REPO
    from difflet.codegen.artifacts import load_artifacts
    from difflet.codegen.build import example_inputs
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize
    from difflet.runtime.runner import ModelRunner
    from oracle_util import compile_art, random_checkpoint

    dsl = lower_file(str(REPO / "models" / "flux-tiny.dsl"))
    ckpt = random_checkpoint(optimize(dsl, parallel="tp1", target="cpu", backend="inductor"))
    cut = compile_art(optimize(dsl, parallel="tp2", target="cpu", backend="inductor", front_blocks=1), ckpt,
                      tmp_path_factory.mktemp("flux-tp2-cut"))
    cut1, whole = flux_arts
    art = load_artifacts(cut)
    try:
        entry = art.manifest.components["transformer"]
        assert entry.world == 2 and [len(p.ranks) for p in entry.parts] == [2, 2]
        assert entry.parts[0].ranks[1].weights == entry.parts[1].ranks[1].weights  # one file per rank
        node = art.module.component("transformer")
        x = example_inputs(node)
        want = load_artifacts(whole).programs["transformer"](*x)
        for got, ref in zip(art.programs["transformer"](*x), want, strict=True):
            assert (got - ref).abs().max().item() <= 1e-4
    finally:
        art.programs["transformer"].close()
    counts = []
    for root in (cut, cut1):
        with ModelRunner.from_artifacts(root) as runner:
            stats = runner.generate(runner.resolve(prompt="a fox", seed=2, steps=STEPS, cache="block:0.05")).stats
            counts.append((stats["schedule"], stats["front_calls"], stats["rest_calls"]))
    assert counts[0] == counts[1] and counts[0][1] == STEPS
