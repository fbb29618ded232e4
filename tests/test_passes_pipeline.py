"""`optimize` on flux-tiny and real-size FLUX.1-dev: layouts, probe, cache keys, golden text."""
import os
from pathlib import Path

import pytest

from difflet.errors import DiffletError
from difflet.frontend.lower import lower_file
from difflet.ir.nodes import Op
from difflet.ir.text import parse_module, print_module
from difflet.passes import memory
from difflet.passes.pipeline import optimize
from difflet.passes.targets import load_target

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden" / "passes"
PINNED = dict(compiler_version="torch==pinned-for-golden", difflet_version="0.1.0")


@pytest.fixture(scope="module")
def tiny():
    return lower_file(REPO / "models" / "flux-tiny.dsl")


@pytest.fixture(scope="module")
def flux():
    return lower_file(REPO / "models" / "flux.dsl")


def _key(m, name="transformer"):
    return next(n for n in m.body if n.name == name).attrs["cache_key"]


def test_golden_flux_tiny_tp2_separate_probe(tiny):
    """The whole planned IR is reviewed text; regenerate with DIFFLET_REGOLD=1 and re-review."""
    planned = optimize(tiny, "tp2", probe="separate", **PINNED)
    text = print_module(planned)
    assert parse_module(text) == planned
    text = text.replace(f"{REPO}/", "")           # locs relative to the repo, wherever it lives
    path = GOLDEN / "flux-tiny.tp2.probe.ir.txt"
    if os.environ.get("DIFFLET_REGOLD"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("par,att", [("tp1", None), ("tp2cp2", "ring"), ("tp2+sp", None),
                                     ("dp2xtp2", None)])
def test_planned_ir_round_trips(tiny, par, att):
    planned = optimize(tiny, par, attention=att, probe="fused", **PINNED)
    assert parse_module(print_module(planned)) == planned
    assert planned.level == "planned"
    for n in planned.body:
        if n.op in (Op.COMPONENT, Op.PROBE):
            assert len(n.attrs["cache_key"]) == 64 and len(n.find(Op.LAYOUT)) == 1


def test_ulysses_layout_of_real_flux(flux):
    planned = optimize(flux, "tp2cp2", target="trn2", attention="ulysses", **PINNED)
    lay = planned.component("transformer").find(Op.LAYOUT)[0]
    site = lay.find(Op.ATTENTION, "transformer_blocks.*.attn")[0].attrs
    # paper 4.3: each rank holds the full joint sequence (4096 + 512) for H/(tp*cp) heads
    assert (site["heads_local"], site["q_len"], site["kv_len"]) == (6, 4608, 4608)
    assert lay.attrs["joint_order"] == ("visual", "text_valid", "text_pad")
    assert lay.attrs["groups"]["cp"] == ((0, 2), (1, 3))
    kinds = sorted(c.attrs["kind"] for c in lay.find(Op.COLLECTIVE) if c.attrs["group"] == "cp")
    assert kinds.count("all_to_all") == 4          # before/after, two joint sites
    vae = planned.component("vae").find(Op.LAYOUT)[0].attrs
    assert (vae["tp"], vae["replicas"]) == (1, 4)  # decoder keeps tp1 on the same 4 cores


def test_illegal_plan_names_rule_component_location_and_alternatives(flux):
    with pytest.raises(DiffletError) as err:
        optimize(flux, "tp4cp4", target="trn2", **PINNED)
    msg = str(err.value)
    assert "heads 24 not divisible by tp*cp = 16" in msg and "rule ulysses-heads" in msg
    assert "component transformer" in msg and "flux.dsl:76:5" in msg
    assert "legal on trn2 with 16 cores: " in msg and "tp4cp4 ring" in msg


def test_flux_tp4_fits_trn2_and_tp1_does_not(flux):
    trn2 = load_target("trn2")
    est = memory.estimate(optimize(flux, "tp4", target="trn2", **PINNED), trn2)
    assert est.fits()
    with pytest.raises(DiffletError, match="rule memory"):
        optimize(flux, "dp4xtp1", target="trn2", **PINNED)


def test_embedded_guidance_rejects_cfg_parallel(flux):
    with pytest.raises(DiffletError, match="rule cfg"):
        optimize(flux, "tp2+cfg2", target="trn2", **PINNED)


def test_cache_key_changes_with_what_is_compiled(tiny):
    base = optimize(tiny, "tp1", **PINNED)
    assert _key(optimize(lower_file(REPO / "models" / "flux-tiny.dsl", {"height": "64"}), "tp1",
                         **PINNED)) != _key(base)                                   # shape
    assert _key(optimize(lower_file(REPO / "models" / "flux-tiny.dsl", {"dtype": "bfloat16"}),
                         "tp1", **PINNED)) != _key(base)                            # dtype
    assert _key(optimize(tiny, "tp2", **PINNED)) != _key(base)                      # layout
    assert _key(optimize(tiny, "tp1", compiler_version="torch==other")) != _key(base)
    fused = optimize(tiny, "tp1", probe="fused", **PINNED)
    assert _key(fused) != _key(base)                                                # probe carried
    separate = optimize(tiny, "tp1", probe="separate", **PINNED)
    assert _key(separate) == _key(base) and _key(separate, "probe") != _key(fused, "probe")


def test_cache_key_ignores_runtime_settings(tiny):
    base = optimize(tiny, "tp1", **PINNED)
    other = lower_file(REPO / "models" / "flux-tiny.dsl", {"steps": "9", "guidance": "5.0"})
    planned = optimize(other, "tp1", **PINNED)
    for name in ("text_encoder", "text_encoder_2", "transformer", "vae"):
        assert _key(planned, name) == _key(base, name)


def test_cache_key_of_a_world1_component_ignores_its_placement(tiny):
    """A replicated TP1 encoder/VAE is one program wherever it is placed: same key (one compile)
    in a tp1 and a 4-rank plan; the split denoiser's key keeps its layout."""
    base, split = optimize(tiny, "tp1", **PINNED), optimize(tiny, "tp2cp2", attention="ring", **PINNED)
    assert split.component("vae").find(Op.LAYOUT)[0].attrs["replicas"] == 4
    for name in ("text_encoder", "text_encoder_2", "vae"):
        assert _key(split, name) == _key(base, name)
    assert _key(split) != _key(base)


def test_program_source_digest_follows_codegen_and_family_program_sources_only(tmp_path):
    from difflet.passes.cache_key import difflet_version, program_source_digest

    hook = tmp_path / "difflet" / "families" / "fam" / "programs.py"
    hook.parent.mkdir(parents=True)
    hook.write_text("PROCESSORS = {}\n")
    (tmp_path / "README.md").write_text("docs\n")
    (hook.parent / "host.py").write_text("STEPS = 1\n")
    first = program_source_digest(tmp_path)
    (tmp_path / "README.md").write_text("other docs\n")
    (hook.parent / "host.py").write_text("STEPS = 2\n")
    assert program_source_digest.__wrapped__(tmp_path) == first  # not program sources
    hook.write_text("PROCESSORS = {'x': None}\n")
    assert program_source_digest.__wrapped__(tmp_path) != first  # an edited hook misses the store
    assert difflet_version().endswith("+src." + program_source_digest())
