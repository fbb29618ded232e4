"""Helpers of the real-size `difflet check` tests (test_check_real_size.py and
test_check_image_inputs_real_size.py): lowering once per module, the CLI check, and the check of
the components a description adds to its base."""
from __future__ import annotations

import time
from pathlib import Path

from click.testing import CliRunner

from difflet.cli import main

REPO = Path(__file__).resolve().parent.parent
# models/*.dsl at real size: the five families, FLUX.1-schnell and FLUX.2 [klein] base 4B (the others are -tiny, -tiny4,
# -bf16, -bench and flux-shapes: toy widths, covered by test_graph_checks.py's tiny cases)
REAL_SIZE = ("flux", "flux-schnell", "qwen-image", "wan2.1", "hunyuan-video", "ltx2", "flux2-klein-base-4b")
# image-input profiles (issue 29) -> their base description (test_check_image_inputs_real_size.py)
IMAGE_INPUT = {"flux-img2img": "flux", "flux-inpaint": "flux", "qwen-image-img2img": "qwen-image",
               "qwen-image-inpaint": "qwen-image", "wan2.1-i2v": "wan2.1", "flux-kontext": "flux",
               "ltx2-i2v": "ltx2", "wan2.2-ti2v-5b-i2v": "wan2.2-ti2v-5b", "wan2.1-flf2v": "wan2.1-i2v"}
# current generations (issue 30) built from a base description's classes and configs -> that base
GENERATIONS = {"wan2.2-a14b": "wan2.1", "wan2.2-ti2v-5b": "wan2.1", "wan2.2-i2v-a14b": "wan2.2-a14b",
               "flux2-klein-4b": "flux2-klein-base-4b"}


def lowering(tmp: Path):
    """name -> (module, saved .ir path) of models/NAME.dsl at real size, lowered on first use."""
    from difflet.frontend.lower import lower_file
    from difflet.ir.binary import save

    out = {}

    def get(name: str):
        if name not in out:
            module = lower_file(REPO / "models" / f"{name}.dsl")
            save(module, tmp / f"{name}.ir")
            out[name] = (module, tmp / f"{name}.ir")
        return out[name]
    return get


def check(ir: Path, target: str, *args: str):
    start = time.perf_counter()
    res = CliRunner().invoke(main, ["check", str(ir), "--target", target, *args])
    print(f"difflet check {ir.stem} --target {target} {' '.join(args)}: {time.perf_counter() - start:.1f} s")
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res


def errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


def check_components(module, ir: Path, names: list[str]) -> None:
    """`names` pass the graph rules: exported for cpu through the CLI (a branching class's one
    program may show only its torch.cond); for trn2 only where the check differs (check_trn2: the
    program module does not depend on the target)."""
    from difflet.codegen.branches import branch_input

    branching = [n for n in names if branch_input(module.component(n))]
    res = check(ir, "cpu", *[a for n in names for a in ("--component", n)])
    assert res.exit_code == (2 if errors(res.output) else 0), res.output
    for line in errors(res.output):
        assert any(f"component {c!r}: data-dependent control flow" in line for c in branching) \
            and ": torch.cond (at " in line, line
    assert all(f"ok {n}" in res.output for n in names if n not in branching), res.output
    check_trn2(module, ir, names)


def check_trn2(module, ir: Path, names: list[str]) -> None:
    """The trn2 rules where they differ from cpu's: branching classes as their branch programs
    (what codegen builds there), and every attention site's head_dim within the NKI kernel's limit."""
    from difflet.codegen.branches import branch_input
    from difflet.codegen.graph_checks import check_head_dims
    from difflet.passes.targets import load_target

    branching = [n for n in names if branch_input(module.component(n))]
    if branching:
        res = check(ir, "trn2", *[a for n in branching for a in ("--component", n)])
        assert res.exit_code == 0 and not errors(res.output), res.output
        assert sorted(line.removeprefix("ok ") for line in res.output.splitlines()
                      if line.startswith("ok ")) == sorted(branching), res.output
    trn2 = dict(load_target("trn2"))
    assert [str(f) for n in names for f in check_head_dims(module.component(n), trn2)] == []
