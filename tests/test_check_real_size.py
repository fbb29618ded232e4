"""`difflet check` on the real-size descriptions (no weights: every component built on the meta
device and exported as codegen exports it), for the cpu/inductor target and the trn2 graph rules.

Oracles: the rules as difflet/codegen/graph_checks.py states them with their sources (no float64,
static shapes, no data-dependent control flow, attention head_dim <= the target's `max_head_dim`),
each shown to fire on graphs built to break them in tests/test_graph_checks.py; here every
component the lowered description lists must be reported `ok`. One exception, by construction:
on a target whose table allows control flow (cpu.json `control_flow: true`) a class that
declares a branch input (Wan's chunked VAE decoder, `first`) is compiled as one program with
`torch.cond`, and `difflet check` applies the Neuron control-flow rule to every target, so it
reports that `torch.cond` (and nothing else) on cpu; on trn2 the same component is built as its
branch programs, which must be clean. Measured per description on the shared 2-core machine:
`--target cpu` 42-98 s (this file: about 7 min; FLUX.1-schnell checks its transformer only), the full `--target trn2` 39-99 s (LTX-2 the slowest),
so the test is `slow`. The full
trn2 check repeats the cpu exports (the program module does not depend on the target; only the
branch programs and the head_dim limit do), so trn2 is checked here where it differs: the branch
components through the CLI and every attention site's head_dim against trn2's limit.
"""
from __future__ import annotations

import pytest

from real_size_util import GENERATIONS, IMAGE_INPUT, REAL_SIZE, REPO, check, check_trn2, errors, lowering


def test_the_real_size_list_is_every_description_that_is_not_a_toy():
    toys = ("-tiny", "-tiny4", "-bf16", "-bench", "flux-shapes")
    found = sorted(p.stem for p in (REPO / "models").glob("*.dsl") if not any(t in p.stem for t in toys))
    assert found == sorted((*REAL_SIZE, *IMAGE_INPUT, *GENERATIONS))


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    return lowering(tmp_path_factory.mktemp("real-size"))


def test_flux2_klein_distilled_is_the_base_description_but_its_schedule(lowered):
    """FLUX.2 [klein] 4B (step-distilled) has klein base 4B's components exactly (the checkpoints
    share architecture and configs), so the base's graph check covers it; only the profile's steps
    and guidance and the guidance mode differ."""
    base, _ = lowered(GENERATIONS["flux2-klein-4b"])
    module, _ = lowered("flux2-klein-4b")
    keys = ("class", "config", "dtype", "entry", "inputs", "outputs")
    assert [c.name for c in module.components()] == [c.name for c in base.components()]
    assert all(c.attrs.get(k) == base.component(c.name).attrs.get(k) for c in module.components() for k in keys)
    assert (module.attrs["profile"]["steps"], base.attrs["profile"]["steps"]) == (4, 50)


@pytest.mark.slow
def test_flux_schnell_differs_from_flux_only_in_its_transformer_which_passes(lowered):
    """FLUX.1-schnell's encoders and VAE are FLUX.1-dev's classes with the same configs and dtypes
    (T5 at 256 tokens instead of 512: a length changes no op or dtype the rules judge), so the check
    of flux covers them; its transformer (no guidance embedding) is checked."""
    flux, _ = lowered("flux")
    schnell, ir = lowered("flux-schnell")
    keys = ("class", "config", "dtype", "entry")
    same = [c.name for c in schnell.components()
            if all(c.attrs.get(k) == flux.component(c.name).attrs.get(k) for k in keys)]
    assert same == ["text_encoder", "text_encoder_2", "vae"]
    res = check(ir, "cpu", "--component", "transformer")
    assert res.exit_code == 0 and not errors(res.output) and "ok transformer" in res.output, res.output


def test_wan22_a14b_is_two_wan21_14b_experts(lowered):
    """Wan 2.2 A14B's experts are Wan 2.1 14B's class with its configs (../shared/models.md: the
    published config is identical), and its encoder and VAE are Wan 2.1's: the graph-rule check of
    wan2.1 covers every program it builds, so it is not exported again here."""
    base, _ = lowered(GENERATIONS["wan2.2-a14b"])
    module, _ = lowered("wan2.2-a14b")
    keys = ("class", "config", "dtype", "entry")
    for comp in module.components():
        twin = base.component("transformer" if comp.name == "transformer_2" else comp.name)
        assert all(comp.attrs.get(k) == twin.attrs.get(k) for k in keys), comp.name
    assert [c.name for c in module.components("denoiser")] == ["transformer", "transformer_2"]


def test_wan22_i2v_a14b_is_the_t2v_experts_with_the_condition_channels_and_wan21_i2v_vae_encoder(lowered):
    """Wan 2.2 I2V A14B's programs are T2V A14B's (checked through wan2.1's) but for the experts'
    in_channels (36: + mask + condition, as Wan 2.1 I2V's), and Wan 2.1 I2V's VAE encoder program
    (checked by test_check_image_inputs_real_size.py): nothing here needs another export."""
    base, _ = lowered(GENERATIONS["wan2.2-i2v-a14b"])
    i2v, _ = lowered("wan2.1-i2v")
    module, _ = lowered("wan2.2-i2v-a14b")
    keys = ("class", "config", "dtype", "entry")
    for comp in module.components():
        twin = i2v.component(comp.name) if comp.name == "vae_encoder" else base.component(comp.name)
        ours, theirs = dict(comp.attrs.get("config") or {}), dict(twin.attrs.get("config") or {})
        if comp.attrs["role"] == "denoiser":
            assert (ours.pop("in_channels"), theirs.pop("in_channels")) == (36, 16), comp.name
        assert ours == theirs and all(comp.attrs.get(k) == twin.attrs.get(k) for k in keys if k != "config"), \
            comp.name


@pytest.mark.slow
def test_wan22_ti2v_5b_residual_vae_passes(lowered):
    """Wan 2.2 TI2V-5B's text encoder is Wan 2.1's (same class, config, dtype: covered by the wan2.1
    check) and its 5B transformer is Wan 2.1's class, entry and dtype at other dimensions (head_dim
    128 as the 14B's; the graph rules judge ops and head_dim, covered by the wan2.1 check at both
    targets); its residual, patchified VAE is checked as the branch programs trn2 builds (each built
    at 704x1280 against the cache channels the description derives; the cpu program is the same
    decoder under one torch.cond, as the tiny test serves it)."""
    base, _ = lowered(GENERATIONS["wan2.2-ti2v-5b"])
    module, ir = lowered("wan2.2-ti2v-5b")
    keys = ("class", "config", "dtype", "entry")
    same = [c.name for c in module.components()
            if all(c.attrs.get(k) == base.component(c.name).attrs.get(k) for k in keys)]
    assert same == ["text_encoder"]
    ours, theirs = module.component("transformer").attrs, base.component("transformer").attrs
    assert all(ours.get(k) == theirs.get(k) for k in ("class", "dtype", "entry"))
    assert ours["config"]["attention_head_dim"] == theirs["config"]["attention_head_dim"] == 128
    check_trn2(module, ir, ["transformer", "vae"])  # the transformer: its head_dim only


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in REAL_SIZE if n != "flux-schnell"])
def test_real_size_description_passes_the_graph_rules(lowered, name):
    from difflet.codegen.branches import branch_input
    from difflet.ir.nodes import Op

    module, ir = lowered(name)
    comps = [c.name for c in module.components()]
    branching = [c.name for c in module.components() if branch_input(c)]
    res = check(ir, "cpu")
    found = errors(res.output)
    # cpu builds a branching class as one program: its torch.cond is the only finding allowed
    for line in found:
        assert any(f"component {c!r}: data-dependent control flow" in line for c in branching) \
            and ": torch.cond (at " in line, line
    assert res.exit_code == (2 if found else 0), res.output
    flagged = {c for c in branching if any(f"component {c!r}:" in line for line in found)}
    assert flagged == set(branching), f"a branching component's one program has no torch.cond: {res.output}"
    ok = [line.removeprefix("ok ") for line in res.output.splitlines() if line.startswith("ok ")]
    assert sorted(ok + sorted(flagged)) == sorted(comps), res.output
    if not found:
        assert f"all {len(comps)} components fit target 'cpu'" in res.output
    # trn2 where it differs: the branch programs and every attention site's head_dim
    assert any(c.find(Op.ATTENTION) for c in module.components())  # the rule has sites to judge
    check_trn2(module, ir, comps)
