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

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from difflet.cli import main

REPO = Path(__file__).resolve().parent.parent
# models/*.dsl at real size: the five families and FLUX.1-schnell (the others are -tiny, -tiny4,
# -bf16, -bench and flux-shapes: toy widths, covered by test_graph_checks.py's tiny cases)
REAL_SIZE = ("flux", "flux-schnell", "qwen-image", "wan2.1", "hunyuan-video", "ltx2")
# image-input profiles (issue 29): their base description plus a VAE encoder program
IMAGE_INPUT = {"flux-img2img": "flux", "flux-inpaint": "flux", "qwen-image-img2img": "qwen-image",
               "qwen-image-inpaint": "qwen-image", "wan2.1-i2v": "wan2.1", "flux-kontext": "flux",
               "ltx2-i2v": "ltx2"}


def test_the_real_size_list_is_every_description_that_is_not_a_toy():
    toys = ("-tiny", "-tiny4", "-bf16", "-bench", "flux-shapes")
    found = sorted(p.stem for p in (REPO / "models").glob("*.dsl") if not any(t in p.stem for t in toys))
    assert found == sorted((*REAL_SIZE, *IMAGE_INPUT))


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    """name -> (module, saved .ir path), lowered on first use (real size, no weights)."""
    from difflet.frontend.lower import lower_file
    from difflet.ir.binary import save

    tmp, out = tmp_path_factory.mktemp("real-size"), {}

    def get(name: str):
        if name not in out:
            module = lower_file(REPO / "models" / f"{name}.dsl")
            save(module, tmp / f"{name}.ir")
            out[name] = (module, tmp / f"{name}.ir")
        return out[name]
    return get


def _check(ir: Path, target: str, *args: str):
    start = time.perf_counter()
    res = CliRunner().invoke(main, ["check", str(ir), "--target", target, *args])
    print(f"difflet check {ir.stem} --target {target} {' '.join(args)}: {time.perf_counter() - start:.1f} s")
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res


def _errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


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
    res = _check(ir, "cpu", "--component", "transformer")
    assert res.exit_code == 0 and not _errors(res.output) and "ok transformer" in res.output, res.output


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flux-img2img", "qwen-image-img2img"])
def test_an_image_input_profile_adds_only_a_vae_encoder_which_passes(lowered, name):
    """Its other components are its base description's (checked there) and its inpainting
    sibling's components are its own, so the VAE encoder is the one new program to check."""
    base, _ = lowered(IMAGE_INPUT[name])
    module, ir = lowered(name)
    keys = ("class", "config", "dtype", "entry")
    others = [c.name for c in module.components() if c.name != "vae_encoder"]
    assert others == [c.name for c in base.components()]
    assert all(module.component(n).attrs.get(k) == base.component(n).attrs.get(k) for n in others for k in keys)
    sibling, _ = lowered(name.replace("img2img", "inpaint"))
    assert [(c.name, *(c.attrs.get(k) for k in keys)) for c in sibling.components()] == \
        [(c.name, *(c.attrs.get(k) for k in keys)) for c in module.components()]
    for target in ("cpu", "trn2"):
        res = _check(ir, target, "--component", "vae_encoder")
        assert res.exit_code == 0 and not _errors(res.output) and "ok vae_encoder" in res.output, res.output


@pytest.mark.slow
def test_flux_kontext_adds_a_vae_encoder_and_joins_the_image_tokens_which_pass(lowered):
    """flux-kontext is flux's classes and configs; its transformer takes the image's 4096 tokens
    beside the output's (a shape only), so the VAE encoder and that transformer are checked."""
    base, _ = lowered("flux")
    module, ir = lowered("flux-kontext")
    keys = ("class", "config", "dtype", "entry")
    assert [c.name for c in module.components() if c.name != "vae_encoder"] == [c.name for c in base.components()]
    assert all(module.component(c.name).attrs.get(k) == c.attrs.get(k) for c in base.components() for k in keys)
    for target in ("cpu", "trn2"):
        res = _check(ir, target, "--component", "vae_encoder", "--component", "transformer")
        assert res.exit_code == 0 and not _errors(res.output), res.output
        assert "ok vae_encoder" in res.output and "ok transformer" in res.output, res.output


@pytest.mark.slow
def test_wan_image_to_video_adds_a_clip_encoder_a_vae_encoder_and_its_transformer_which_pass(lowered):
    """wan2.1-i2v is wan2.1 (its UMT5 and VAE decoder unchanged, checked there) with a CLIP image
    encoder, a whole-clip VAE encoder and the I2V transformer: the three new programs are checked
    (measured: cpu 20 s, trn2 28 s for the three)."""
    base, _ = lowered("wan2.1")
    module, ir = lowered("wan2.1-i2v")
    keys = ("class", "config", "dtype", "entry")
    new = ["image_encoder", "transformer", "vae_encoder"]
    assert sorted(set(c.name for c in module.components()) - {"text_encoder", "vae"}) == new
    assert all(module.component(n).attrs.get(k) == base.component(n).attrs.get(k)
               for n in ("text_encoder", "vae") for k in keys)
    for target in ("cpu", "trn2"):
        res = _check(ir, target, *[a for n in new for a in ("--component", n)])
        assert res.exit_code == 0 and not _errors(res.output), res.output
        assert all(f"ok {n}" in res.output for n in new), res.output


@pytest.mark.slow
def test_ltx2_image_to_video_adds_a_vae_encoder_and_a_per_token_timestep_which_pass(lowered):
    """ltx2-i2v is ltx2 (its text encoder, connectors and decoders unchanged, checked there) with
    the VAE's encoder program and a transformer taking the per-token `video_timestep` (and its
    timesteps in float32, as the pipeline passes them): the two programs are checked."""
    base, _ = lowered("ltx2")
    module, ir = lowered("ltx2-i2v")
    keys = ("class", "config", "dtype", "entry")
    new = ["transformer", "vae_encoder"]
    same = [c.name for c in base.components() if c.name != "transformer"]
    assert sorted(set(c.name for c in module.components()) - set(same)) == new
    assert all(module.component(n).attrs.get(k) == base.component(n).attrs.get(k) for n in same for k in keys)
    for target in ("cpu", "trn2"):
        res = _check(ir, target, *[a for n in new for a in ("--component", n)])
        assert res.exit_code == 0 and not _errors(res.output), res.output
        assert all(f"ok {n}" in res.output for n in new), res.output


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in REAL_SIZE if n != "flux-schnell"])
def test_real_size_description_passes_the_graph_rules(lowered, name):
    from difflet.codegen.branches import branch_input
    from difflet.codegen.graph_checks import check_head_dims
    from difflet.ir.nodes import Op
    from difflet.passes.targets import load_target

    module, ir = lowered(name)
    comps = [c.name for c in module.components()]
    branching = [c.name for c in module.components() if branch_input(c)]
    res = _check(ir, "cpu")
    errors = _errors(res.output)
    # cpu builds a branching class as one program: its torch.cond is the only finding allowed
    for line in errors:
        assert any(f"component {c!r}: data-dependent control flow" in line for c in branching) \
            and ": torch.cond (at " in line, line
    assert res.exit_code == (2 if errors else 0), res.output
    flagged = {c for c in branching if any(f"component {c!r}:" in line for line in errors)}
    assert flagged == set(branching), f"a branching component's one program has no torch.cond: {res.output}"
    ok = [line.removeprefix("ok ") for line in res.output.splitlines() if line.startswith("ok ")]
    assert sorted(ok + sorted(flagged)) == sorted(comps), res.output
    if not errors:
        assert f"all {len(comps)} components fit target 'cpu'" in res.output
    # trn2: the branching components as their branch programs (what codegen builds there) ...
    if branching:
        res = _check(ir, "trn2", *[a for c in branching for a in ("--component", c)])
        assert res.exit_code == 0 and not _errors(res.output), res.output
        assert sorted(line.removeprefix("ok ") for line in res.output.splitlines() if line.startswith("ok ")) \
            == sorted(branching)
    # ... and every attention site within the NKI kernel's head_dim limit
    trn2 = dict(load_target("trn2"))
    assert any(c.find(Op.ATTENTION) for c in module.components())  # the rule has sites to judge
    assert [str(f) for c in module.components() for f in check_head_dims(c, trn2)] == []
