"""Attention on `--backend neuron` goes through NKI's attention_cte, never SDPA (issue 26, finding 4).

Program modules of the tiny FLUX and Qwen-Image denoisers are built as codegen builds them for
the neuron backend (build_program_module(..., "neuron")) on CPU, with the kernel replaced by
tests/nki_attention_double.py (nki-library 2.29's attention_cte / attention_cte_torch.py; see
there). Each forward runs under a TorchFunctionMode and a TorchDispatchMode that record
scaled_dot_product_attention at the torch function and aten levels and every op's output shape
outside the kernel. Asserted: one attention_cte call per attention site, no SDPA, no score
tensor outside the kernel, outputs equal the inductor-path module's (fp32, 1e-5: the same float32
softmax summed in a different order). The split modes (ulysses, ring, gather_kv) run over a
1-rank group (group None), so they are reachable on CPU. Each of trn2.json's attention claims
(materializes_scores, fused_attention.*) is backed by one test below.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from difflet.codegen.build import build_program_module, example_inputs
from difflet.ir.nodes import Op
from difflet.kernels import attention_nki
from difflet.kernels.select import FUSED, IMPLEMENTATIONS, attention_kernel
from nki_attention_double import AttentionCteDouble

REPO = Path(__file__).resolve().parent.parent
TRN2 = json.loads((REPO / "difflet" / "passes" / "targets" / "trn2.json").read_text())
SDPA_ATEN = "scaled_dot_product"  # every aten SDPA overload's name contains it


class Recorder(TorchFunctionMode):
    """F.scaled_dot_product_attention calls (torch function level)."""

    def __init__(self):
        super().__init__()
        self.sdpa = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.sdpa += 1
        return func(*args, **(kwargs or {}))


class Shapes(TorchDispatchMode):
    """aten ops run outside the kernel double: their names and output shapes."""

    def __init__(self, double):
        super().__init__()
        self.double, self.ops = double, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.double.inside:
            shapes = [tuple(t.shape) for t in (out if isinstance(out, (tuple, list)) else [out])
                      if isinstance(t, torch.Tensor)]
            self.ops.append((str(func), shapes))
        return out


class CountingDouble(AttentionCteDouble):
    def __init__(self):
        super().__init__()
        self.inside = False

    def __call__(self, *args, **kwargs):
        self.inside = True
        try:
            return super().__call__(*args, **kwargs)
        finally:
            self.inside = False


@pytest.fixture
def double(monkeypatch):
    kern = CountingDouble()
    monkeypatch.setattr(attention_nki, "nki_kernel", lambda: kern)  # looked up per call
    return kern


def _denoiser(dsl: str):
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize
    from conftest import shared_store_dir

    module = optimize(lower_file(str(REPO / "difflet" / "models" / dsl)), "tp1", target="trn2", backend="neuron")
    node = module.component("transformer")
    return node, resolve_weights(module, "random:0", shared_store_dir())


@pytest.fixture(scope="module", params=["flux-tiny.dsl", "qwen-image-tiny.dsl"])
def family(request):
    node, ckpt = _denoiser(request.param)
    return request.param, node, build_program_module(node, ckpt, "neuron"), build_program_module(node, ckpt, "inductor")


def _sites(pm):
    return [m for m in pm.model.modules() if hasattr(m, "processor") and hasattr(m.processor, "kernel")]


def _run(pm, inputs, double):
    rec, shapes = Recorder(), Shapes(double)
    with torch.no_grad(), rec, shapes:
        out = pm(*inputs)
    return out, rec, shapes


def _with_valid(node, valid: int):
    x = list(example_inputs(node))
    x[-1] = torch.tensor(valid)  # valid_text is the last IR input of both denoisers
    return tuple(x)


@pytest.mark.parametrize("valid", [None, 3])
def test_every_site_calls_attention_cte_once_and_sdpa_never(family, double, valid):
    name, node, pm_neuron, pm_inductor = family
    x = example_inputs(node) if valid is None else _with_valid(node, valid)
    out, rec, shapes = _run(pm_neuron, x, double)
    assert len(double.calls) == len(_sites(pm_neuron)) > 0
    assert rec.sdpa == 0 and not [op for op, _ in shapes.ops if SDPA_ATEN in op]
    # FLUX's sites have no text mask: on neuron the padding is attended whatever valid_text says,
    # so it equals inductor at the valid_text its host passes (the padded length, flux/host.py)
    flux_masked = name.startswith("flux") and valid is not None
    with torch.no_grad():
        want = pm_inductor(*(example_inputs(node) if flux_masked else x))
    for g, w in zip(out, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_the_inductor_module_keeps_fused_sdpa(family, double):
    name, node, _, pm_inductor = family
    _, rec, shapes = _run(pm_inductor, example_inputs(node), double)
    assert double.calls == [] and all(s.processor.kernel.name == "fused" for s in _sites(pm_inductor))
    assert rec.sdpa + sum(SDPA_ATEN in op for op, _ in shapes.ops) > 0


def test_bounds_only_where_the_text_is_masked(family, double):
    """FLUX attends its padding (text_mask false): NxD Inference's unbounded call; Qwen-Image
    masks its text: bounds [0, V + valid) on every row (fused_attention.contiguous_valid_keys)."""
    name, node, pm, _ = family
    _run(pm, _with_valid(node, 3), double)
    text = next(n.results[0].type.shape[1] for n in node.find(Op.INPUT) if n.name == "encoder_hidden_states")
    seq = double.calls[0]["k"][1]
    if name.startswith("flux"):
        assert all(c["bound_min"] is None and c["scale"] != 1.0 for c in double.calls)
    else:
        assert TRN2["fused_attention"]["contiguous_valid_keys"] is True
        for c in double.calls:
            assert torch.equal(c["bound_min"], torch.zeros(c["q"][1], 1))
            joint = next(n.results[0].type.shape[1] for n in node.find(Op.INPUT) if n.name == "hidden_states") + text
            assert seq >= joint and torch.equal(c["bound_max"], torch.full((c["q"][1], 1), joint - text + 3.0))


def test_no_scores_outside_the_kernel(family, double):
    """trn2.json materializes_scores false: no [.., S, S] tensor outside attention_cte."""
    assert TRN2["materializes_scores"] is False
    name, node, pm, _ = family
    _, _, shapes = _run(pm, _with_valid(node, 3), double)
    lengths = {c["q"][1] for c in double.calls} | {c["k"][1] for c in double.calls}
    scores = [(op, s) for op, ss in shapes.ops for s in ss if len(s) >= 2 and s[-1] in lengths and s[-2] in lengths]
    assert scores == []


def test_the_backend_declares_the_kernel():
    assert attention_kernel("neuron") is IMPLEMENTATIONS["nki"] and attention_kernel("inductor") is FUSED
    assert attention_kernel(None) is FUSED


def _split_inputs(seed=0, b=1, h=2, vis=24, text=8, d=16):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, text + vis, d, generator=g) for _ in range(3))


@pytest.mark.parametrize("text_mask", [True, False])
@pytest.mark.parametrize("mode", ["ulysses", "ring", "gather_kv"])
def test_split_modes_call_the_kernel_and_ring_folds_its_stats(double, mode, text_mask):
    """1-rank CP group: every mode's kernel calls go to attention_cte; Ring is separate calls
    (text, then each visual shard) merged by the kernel's own lse; each masked call has equal
    padded Q/K lengths (fused_attention.equal_qk_len_when_masked, ring_kernel_equal_qk_len)."""
    from difflet.codegen.joint_ops import split_joint_attention

    assert TRN2["fused_attention"]["equal_qk_len_when_masked"] and TRN2["fused_attention"]["ring_kernel_equal_qk_len"]
    q, k, v = _split_inputs()
    valid = torch.tensor(5 if text_mask else 8)
    kern = IMPLEMENTATIONS["nki"].for_site(text_mask)
    rec = Recorder()
    with torch.no_grad(), rec:
        got = split_joint_attention(q, k, v, 8, True, valid, mode, None, kernel=kern)
    want = split_joint_attention(q, k, v, 8, True, valid, mode, None, kernel=FUSED)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert rec.sdpa == 0 and len(double.calls) == (2 if mode == "ring" else 1)
    if mode == "ring":
        assert all(c["cache_softmax"] for c in double.calls)
    for c in double.calls:
        assert (c["bound_min"] is not None) == (text_mask and (mode != "ring" or c is double.calls[0]))
        if c["bound_min"] is not None:
            assert c["q"][1] == c["k"][1]
