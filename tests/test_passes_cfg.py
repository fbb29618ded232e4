"""cfg-branch: a CFG-parallel plan's denoiser carries the unconditional pass's inputs and outputs.

The golden is the whole planned qwen-image-tiny tp1+cfg2 IR (reviewed text; regenerate with
DIFFLET_REGOLD=1 and re-review); the other tests check the pass's invariants against the IR
itself and the verdicts `--list-legal` gives (passes/built.py, the one source codegen reads).
"""
from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from difflet.errors import DiffletError
from difflet.frontend.lower import lower_file
from difflet.ir import binary
from difflet.ir.nodes import Op
from difflet.ir.text import parse_module, print_module
from difflet.passes import built
from difflet.passes.cfg_branch import add_uncond_branch, cond_view
from difflet.passes.pipeline import optimize

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden" / "passes"
PINNED = dict(compiler_version="torch==pinned-for-golden", difflet_version="0.1.0")


@pytest.fixture(scope="module")
def qwen():
    return lower_file(REPO / "models" / "qwen-image-tiny.dsl")


def _names(comp, op):
    return [n.name for n in comp.find(op)]


def test_golden_qwen_image_tiny_tp1_cfg2(qwen):
    """The twins are in the reviewed text, and the text and binary forms round-trip exactly."""
    planned = optimize(qwen, "tp1+cfg2", **PINNED)
    text = print_module(planned)
    assert parse_module(text) == planned and binary.decode(binary.encode(planned)) == planned
    text = text.replace(f"{REPO}/", "")
    path = GOLDEN / "qwen-image-tiny.tp1+cfg2.ir.txt"
    if os.environ.get("DIFFLET_REGOLD"):
        path.write_text(text)
    assert text == path.read_text()


def test_twins_follow_the_declared_branch_inputs_with_their_types(qwen):
    den = optimize(qwen, "tp1+cfg2", **PINNED).component("transformer")
    assert _names(den, Op.INPUT) == ["hidden_states", "encoder_hidden_states", "timestep", "valid_text",
                                     "uncond_encoder_hidden_states", "uncond_valid_text"]
    assert _names(den, Op.OUTPUT) == ["sample", "uncond_sample"]
    for twin in den.find(Op.INPUT)[4:] + den.find(Op.OUTPUT)[1:]:
        (orig,) = [n for n in den.body if n.name == twin.attrs["twin"]]
        assert twin.attrs["branch"] == "uncond" and twin.results[0].type == orig.results[0].type
        assert twin.args == orig.args  # the runtime twin reads the same module runtime value


def test_cond_view_is_the_inner_single_pass_component(qwen):
    """Folding the cfg axis away gives the tp1 plan's component, layout placement aside."""
    den = optimize(qwen, "tp1+cfg2", **PINNED).component("transformer")
    tp1 = optimize(qwen, "tp1", **PINNED).component("transformer")
    inner = cond_view(den)
    assert [n for n in inner.body if n.op != Op.LAYOUT] == [n for n in tp1.body if n.op != Op.LAYOUT]
    la = inner.find(Op.LAYOUT)[0].attrs
    assert (la["cfg"], la["world"], la["tp"], la["cp"]) == (1, 1, 1, 1)


@pytest.mark.parametrize("inner", ["tp1", "tp2"])
def test_the_inner_view_keys_as_the_plan_without_cfg(qwen, inner):
    """codegen compiles cond_view under its own key: equal to the plain plan's, so a cfg2 artifact
    reuses that plan's programs (placement folded to the inner layout's, as plan-parallel places it)."""
    from difflet.passes.cache_key import keyed

    cfg = optimize(qwen, f"{inner}+cfg2", **PINNED)
    plain = optimize(qwen, inner, **PINNED).component("transformer")
    assert keyed(cfg, cond_view(cfg.component("transformer"))) == plain


def test_replanning_without_cfg_drops_the_twins_and_other_components_are_untouched(qwen):
    cfg = optimize(qwen, "tp1+cfg2", **PINNED)
    again = optimize(cfg, "tp1", **PINNED)
    assert again == optimize(qwen, "tp1", **PINNED)
    assert add_uncond_branch(cfg.component("transformer")) == cfg.component("transformer")  # idempotent
    for name in ("text_encoder", "vae"):
        assert _names(cfg.component(name), Op.INPUT) == _names(again.component(name), Op.INPUT)


def test_cfg_changes_the_denoiser_cache_key_only(qwen):
    cfg, tp1 = optimize(qwen, "tp1+cfg2", **PINNED), optimize(qwen, "tp1", **PINNED)
    keys = lambda m: {c.name: c.attrs["cache_key"] for c in m.components()}  # noqa: E731
    assert keys(cfg)["transformer"] != keys(tp1)["transformer"]
    assert {k: v for k, v in keys(cfg).items() if k != "transformer"} == \
        {k: v for k, v in keys(tp1).items() if k != "transformer"}


def test_an_undeclared_branch_input_is_an_error_naming_it(qwen, monkeypatch):
    import dataclasses

    from difflet import families

    cls = "diffusers.QwenImageTransformer2DModel"
    real = families.facts
    facts = real("qwen_image")
    rules = {cls: dict(facts.rules[cls], cfg_branch=("negative_embeds",))}
    monkeypatch.setattr(families, "facts", lambda f: dataclasses.replace(facts, rules=rules)
                        if f == "qwen_image" else real(f))
    with pytest.raises(DiffletError, match=r"cfg branch inputs \['negative_embeds'\] are not inputs"):
        optimize(qwen, "tp1+cfg2", **PINNED)


def test_embedded_guidance_is_refused_and_an_undeclared_class_is_not_built(qwen):
    with pytest.raises(DiffletError, match="cfg2 needs true classifier-free guidance"):
        optimize(lower_file(REPO / "models" / "flux-tiny.dsl"), "tp1+cfg2", **PINNED)
    den = optimize(qwen, "tp1+cfg2", **PINNED).component("transformer")
    bare = msgspec.structs.replace(den, body=tuple(n for n in den.body if n.attrs.get("branch") != "uncond"))
    assert "declares no inputs of the unconditional pass" in built.layout_reason(bare)
    assert built.layout_reason(den) is None


@pytest.mark.parametrize("model, cores, verdicts", [
    ("ltx2-tiny", 2, {"tp1+cfg2": "legal"}),  # inner world 1: any class, no split program needed
    ("ltx2-tiny", 4, {"tp2+cfg2": "legal", "tp1cp2+cfg2 ring": "legal"}),  # inner tp2 / cp2: split programs
    ("qwen-image-tiny", 4, {"tp2+cfg2": "legal", "tp1cp2+cfg2 ring": "legal", "dp2xtp1+cfg2": "legal"}),
])
def test_list_legal_calls_cfg_layouts_legal_exactly_where_codegen_builds_them(model, cores, verdicts):
    from difflet.passes.legal_configs import table
    from difflet.passes.parallel_config import parse_parallel
    from difflet.passes.pipeline import Options

    text = table(lower_file(REPO / "models" / f"{model}.dsl"), Options(parse_parallel("tp1")), cores)
    rows = {r.split(" | ")[0].strip("| "): r.split(" | ")[3] for r in text.splitlines() if r.startswith("| ")}
    for config, verdict in verdicts.items():
        assert rows[config].startswith(verdict), (config, rows[config])
