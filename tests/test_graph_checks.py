"""`difflet check --target trn2`: the graph rules every Neuron program must satisfy, on CPU.

Oracles: the rules are stated in difflet/codegen/graph_checks.py with their sources (Neuron has
no FP64; neuronx-cc implements no control flow; NKI attention_cte takes head_dim <= 128). Each
rule is shown to fire on a graph built to break it, and the five tiny families' components are
checked as codegen exports them (random:0 checkpoints from the shared test store).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from difflet.cli import main
from difflet.codegen.branches import torch_traces_cond
from difflet.codegen.graph_checks import check_exported, check_head_dims
from difflet.frontend.lower import lower_file
from difflet.ir.binary import save
from difflet.passes.targets import load_target

REPO = Path(__file__).resolve().parent.parent
TINY = {"flux": "flux-tiny", "qwen-image": "qwen-image-tiny", "wan2.1": "wan2.1-tiny",
        "hunyuan-video": "hunyuan-video-tiny", "ltx2": "ltx2-tiny"}


@pytest.fixture(scope="module")
def flux_tiny():
    return lower_file(REPO / "models" / "flux-tiny.dsl")


def _export(fn, *args, **kw):
    class M(torch.nn.Module):
        def forward(self, *xs):
            return fn(*xs)
    return torch.export.export(M(), args, strict=False, **kw)


def _check(ir_path: Path, *args: str):
    from conftest import shared_store_dir

    return CliRunner().invoke(main, ["check", str(ir_path), "--target", "trn2", "--weights", "random:0",
                                     "--store", str(shared_store_dir()), *args])


def test_a_float64_graph_fails_with_the_op_named(flux_tiny):
    comp = flux_tiny.component("transformer")
    ep = _export(lambda x: (x.double() * 3).float(), torch.ones(4))
    found = check_exported(comp, ep)
    rules = {(f.rule, f.op.split(" ")[0]) for f in found}
    assert ("float64 op", "mul.Tensor") in rules
    assert all(f.loc == str(comp.loc) and "flux-tiny.dsl" in f.loc for f in found)
    assert any("test_graph_checks.py:" in f.source for f in found)  # the Python line that made the op


def test_a_float32_graph_is_clean(flux_tiny):
    comp = flux_tiny.component("transformer")
    assert check_exported(comp, _export(lambda x: (x * 3).sin(), torch.ones(4))) == []


def test_dynamic_dimension_and_control_flow_are_flagged(flux_tiny):
    comp = flux_tiny.component("vae")
    dyn = _export(lambda x: x * 2, torch.ones(4, 3), dynamic_shapes=(({0: torch.export.Dim("n", min=2)},),))
    assert any(f.rule == "dynamic dimension" for f in check_exported(comp, dyn))
    cond = _export(lambda p, x: torch.cond(p > 0, lambda y: y + 1, lambda y: y - 1, (x,)),
                   torch.tensor(1), torch.ones(3))
    assert any(f.op == "torch.cond" and "control flow" in f.rule for f in check_exported(comp, cond))
    nz = _export(lambda x: x.nonzero(), torch.ones(3))
    assert any("unbacked" in f.rule for f in check_exported(comp, nz))


def test_head_dim_limit_is_read_from_the_target_table(flux_tiny):
    comp = flux_tiny.component("transformer")  # head_dim 16
    assert check_head_dims(comp, dict(load_target("trn2"))) == []
    found = check_head_dims(comp, {**load_target("trn2"), "max_head_dim": 8})
    assert found and all("head_dim 16" in f.op for f in found)


def test_diffusers_float64_rope_is_caught_end_to_end(tmp_path, monkeypatch):
    """Without Difflet's RoPE replacement LTX-2's denoiser graph has diffusers' float64 ops (FLUX's
    tables come from the host, so its graph has no RoPE to catch)."""
    monkeypatch.setattr("difflet.codegen.build.install_fp32_rope", lambda model: 0)
    save(lower_file(REPO / "models" / "ltx2-tiny.dsl"), tmp_path / "ltx2.ir")
    res = _check(tmp_path / "ltx2.ir", "--component", "transformer")
    assert res.exit_code == 2, res.output
    assert "component 'transformer': float64 op" in res.output and "ltx2-tiny.dsl" in res.output


@pytest.mark.parametrize("name", TINY)
def test_every_tiny_component_fits_trn2(tmp_path, name):
    """Every component passes as codegen builds it for trn2; Wan's chunked VAE decoder, which
    branches on the runtime `first`, is checked as its two branch programs (first=0, first=1)."""
    save(lower_file(REPO / "models" / f"{TINY[name]}.dsl"), tmp_path / "m.ir")
    res = _check(tmp_path / "m.ir")
    assert res.exit_code == 0, res.output
    assert [line for line in res.output.splitlines() if line.startswith("error:")] == []


def test_the_meta_device_path_checks_without_weights(tmp_path):
    """The CLI default (no --weights): components built on the meta device, as real-size
    descriptions are checked; wan2.1-tiny covers the family wrappers and the branch programs."""
    save(lower_file(REPO / "models" / "wan2.1-tiny.dsl"), tmp_path / "m.ir")
    res = CliRunner().invoke(main, ["check", str(tmp_path / "m.ir"), "--target", "trn2"])
    assert res.exit_code == 0, res.output
    assert "all 3 components fit target 'trn2'" in res.output


@pytest.mark.skipif(not torch_traces_cond(), reason="this torch cannot export the decoder as one torch.cond "
                    "program (codegen builds branch programs instead: codegen/branches.py)")
def test_a_branching_component_as_one_program_is_flagged():
    """The same Wan decoder as one program (what a target with control flow gets) has the
    torch.cond neuronx-cc cannot compile: the check sees what codegen builds, per target."""
    from conftest import shared_store_dir

    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.graph_checks import check_module

    module = lower_file(REPO / "models" / "wan2.1-tiny.dsl")
    ckpt = resolve_weights(module, "random:0", shared_store_dir())
    found = check_module(module, {**load_target("trn2"), "control_flow": True}, ckpt, only=("vae",))["vae"]
    assert found and all(f.op == "torch.cond" and "families/wan/vae.py" in f.source for f in found), found
    clean = check_module(module, dict(load_target("trn2")), ckpt, only=("vae",))["vae"]
    assert clean == []


def test_unknown_component_is_a_usage_error(tmp_path, flux_tiny):
    save(flux_tiny, tmp_path / "flux.ir")
    res = _check(tmp_path / "flux.ir", "--component", "nope")
    assert res.exit_code == 2 and "no component 'nope'" in res.output
