"""Program modules as torch-xla / torch-neuronx trace them: no host reads, no float64, one graph.

Oracles: eager torch on the unmodified ops (each rewrite of difflet/codegen/portable_ops.py must
be bit-identical to it), and the rule that a program must not read a tensor value on the host
(`aten._local_scalar_dense`, `nonzero`): under torch-xla's lazy tracing such a read bakes the
traced example's branch into the program (bench/xla_check.py measured it on the text encoders,
whose masks transformers skips after `padding_mask.all()`). The model oracle tests (compiled ==
diffusers) cover the rewritten modules' outputs; this file covers the rewrites themselves.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from difflet.codegen.portable_ops import PortableOps, install_portable_ops

REPO = Path(__file__).resolve().parent.parent
TINY = ["flux-tiny", "qwen-image-tiny", "wan2.1-tiny", "hunyuan-video-tiny", "ltx2-tiny"]


def _both(fn, *args):
    """(fn under PortableOps, fn plain)."""
    with PortableOps():
        got = fn(*args)
    return got, fn(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rewrites_are_bit_identical_to_eager(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 7, generator=g).to(dtype)
    v = torch.randn(1, 2, 3, 4, 5, generator=g).to(dtype)
    cases = {
        "nearest 2x": lambda: F.interpolate(x, scale_factor=2.0, mode="nearest"),
        "nearest-exact 2x (nn.Upsample)": lambda: torch.nn.Upsample(scale_factor=(2.0, 2.0), mode="nearest-exact")(x),
        "nearest by size 4x2": lambda: F.interpolate(x, size=(20, 14), mode="nearest"),
        "nearest 3-d (1, 2, 2)": lambda: F.interpolate(v, scale_factor=(1, 2, 2), mode="nearest"),
        "compare with a float": lambda: (x >= -0.25, x < 1e-6, torch.gt(x, 0.1), x.le(1 / 3), x == 0.5),
        "masked_fill with a float": lambda: (x.masked_fill(x > 0, float("-inf")), torch.masked_fill(x, x < 0, 0.1)),
        "leaky_relu": lambda: (F.leaky_relu(x, 0.1), torch.nn.LeakyReLU(0.2)(x), F.leaky_relu(x)),
        "over-long negative slice start": lambda: (v[:, :, -7:], v[:, :, -2:, 1:], x[:, -9:, 2]),
    }
    for name, fn in cases.items():
        got, want = _both(fn)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want, strict=True)), name


def test_only_what_it_can_rewrite_exactly_is_rewritten():
    """A factor that is not a power of two, bilinear, or a bf16 comparison with a value bf16
    does not represent keep their ops (the rewrite would not be bit-identical)."""
    x = torch.randn(1, 2, 3, 3)

    def ops(fn):
        def rewritten(t):
            with PortableOps():
                return fn(t)
        gm = torch.fx.experimental.proxy_tensor.make_fx(rewritten)(x)
        return {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}

    assert not any("upsample" in o for o in ops(lambda t: F.interpolate(t, scale_factor=2.0, mode="nearest")))
    assert any("upsample_nearest2d" in o for o in ops(lambda t: F.interpolate(t, scale_factor=3.0, mode="nearest")))
    assert any("upsample_bilinear" in o for o in ops(lambda t: F.interpolate(t, scale_factor=2.0, mode="bilinear")))
    assert not any("full" in o for o in ops(lambda t: t.bfloat16() < 0.1))  # 0.1 is not a bf16 value
    assert any("full" in o for o in ops(lambda t: t < 0.1))  # float32 compares in float32 anyway


def test_installed_on_a_module_without_renaming_its_weights():
    up = torch.nn.Sequential(torch.nn.Conv2d(2, 2, 1), torch.nn.Upsample(scale_factor=2.0))
    keys = list(up.state_dict())
    install_portable_ops(up)
    assert list(up.state_dict()) == keys
    ep = torch.export.export(up, (torch.randn(1, 2, 4, 4),), strict=False)
    assert not any("upsample" in str(n.target) for n in ep.graph.nodes)  # the rewrite is in the graph
    with pytest.raises(RuntimeError):  # the mode is left even when forward raises
        up(torch.randn(1, 3, 4, 4))
    assert not torch.overrides._get_current_function_mode_stack()


class HostReads(TorchDispatchMode):
    """Records ops that read tensor values on the host or size outputs by data."""

    READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default}

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("model", TINY)
def test_no_program_reads_a_tensor_value_on_the_host(model):
    """Every component as trn2 codegen builds it (Wan's decoder as its branch programs), run at
    its example inputs and at runtime value 1: no host read, so a lazy trace is one graph."""
    from conftest import shared_store_dir

    from difflet.codegen.branches import branch_views
    from difflet.codegen.build import build_program_module, example_inputs
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.frontend.lower import lower_file
    from difflet.ir.nodes import Op, RuntimeType

    module = lower_file(REPO / "models" / f"{model}.dsl")
    ckpt = resolve_weights(module, "random:0", shared_store_dir())
    for comp in module.components():
        for _, view in branch_views(comp, control_flow=False) or [(None, comp)]:
            pm = build_program_module(view, ckpt)
            inputs = example_inputs(view)
            low = tuple(torch.tensor(1) if isinstance(n.results[0].type, RuntimeType) else t
                        for n, t in zip(view.find(Op.INPUT), inputs))
            for args in (inputs, low):
                with torch.no_grad(), HostReads() as reads:
                    pm(*args)
                assert reads.seen == [], f"{model} {view.name} {view.attrs.get('branch')}: {reads.seen}"
