"""The typed attrs views (passes/layout_attrs.py) and the CP mode declarations (passes/cp_modes.py)
against docs/ir.md's schemas and hand-computed plans. Torch-free."""
from pathlib import Path

import pytest

from difflet.errors import DiffletError
from difflet.frontend.lower import lower_file
from difflet.ir.nodes import Attrs, Loc, Node, Op
from difflet.passes import cp_modes
from difflet.passes.layout_attrs import Layout, PlannedSite, Site
from difflet.passes.parallel_config import ParallelConfig, parse_parallel
from difflet.passes.plan_parallel import plan_parallel

REPO = Path(__file__).resolve().parent.parent
LOC = Loc("model.dsl", 7, 3)


def _site(**attrs) -> Node:
    return Node(Op.ATTENTION, "blocks.*.attn", Attrs(attrs), loc=LOC)


@pytest.mark.parametrize("kind, order, streams", [
    ("joint", ("text", "visual"), ("joint", "joint")),
    ("self", ("visual",), ("visual", "visual")),
    ("cross", ("visual", "text"), ("visual", "text")),
])
def test_site_order_defaults_by_kind(kind, order, streams):
    site = Site.of(_site(kind=kind, heads=4, head_dim=8))
    assert (site.order, site.streams, site.text_mask, site.valid) == (order, streams, False, None)


def test_site_keeps_a_given_order():
    site = Site.of(_site(kind="self", heads=4, head_dim=8, order=("audio",)))
    assert site.streams == ("audio", "audio") and not site.text_first


@pytest.mark.parametrize("attrs, says", [
    (dict(kind="joint", heads="4", head_dim=8), "heads"),
    (dict(kind="joint", head_dim=8), "heads"),
    (dict(kind="diagonal", heads=4, head_dim=8), "kind"),
])
def test_bad_site_attrs_name_the_site_and_its_location(attrs, says):
    with pytest.raises(DiffletError, match=says) as err:
        Site.of(_site(**attrs))
    assert err.value.where == LOC and "blocks.*.attn" in str(err.value)


def test_layout_defaults_and_degrees():
    la = Layout.of(Attrs(tp=2, cp=2, dp=2, world=8))
    assert (la.cfg, la.sp, la.attention, la.world, la.replica_world) == (1, False, "none", 8, 4)
    assert la.config() == ParallelConfig(tp=2, cp=2, dp=2) and type(la.config()) is ParallelConfig


def test_mode_choices_are_every_mode_but_local():
    assert cp_modes.CHOICES == ("ulysses", "ring", "gather_kv") and cp_modes.DEFAULT in cp_modes.CHOICES
    assert set(cp_modes.MODES) == set(cp_modes.CHOICES) | {"local"}


@pytest.fixture(scope="module")
def tiny():
    return lower_file(REPO / "models" / "flux-tiny.dsl")


@pytest.mark.parametrize("mode", cp_modes.CHOICES)
def test_planned_joint_site_per_mode(tiny, mode):
    """flux-tiny at tp1cp2: heads and lengths of one call per mode as docs/ir.md states them
    (V visual tokens, halved on a rank by cp; T text tokens, replicated)."""
    planned = plan_parallel(tiny, parse_parallel("tp1cp2", mode))
    den = planned.component("transformer")
    decl = Site.of(den.find(Op.ATTENTION)[0])
    lay = den.find(Op.LAYOUT)[0]
    site = PlannedSite.of(lay.find(Op.ATTENTION)[0])
    full = Layout.of(lay).tokens
    v, t = full["visual"], full["text"]
    expect = {"ulysses": (decl.heads // 2, v + t, v + t, ()),
              "ring": (decl.heads, v // 2 + t, v // 2, ("visual[0]", "visual[1]", "text[0:valid)")),
              "gather_kv": (decl.heads, v // 2 + t, v + t, ())}[mode]
    assert (site.mode, site.heads_local, site.q_len, site.kv_len, site.calls) == (mode, *expect)
