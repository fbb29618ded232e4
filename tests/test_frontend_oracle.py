"""The lowered flux-tiny IR against the real (unsplit) diffusers/transformers modules.

Each component is built at tiny size from the config the IR carries, fed random tensors of the
declared input shapes/dtypes through its declared `entry`, and the declared output (`select`)
must come back with the declared shape; the parameter count must equal the real module's, and
params_blocks_linear the nn.Linear parameters counted independently by block-list name.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from difflet.frontend.lower import lower_file
from difflet.ir.nodes import Op

torch = pytest.importorskip("torch")

ROPE_TABLES = {"img_rope": "img_ids", "txt_rope": "txt_ids"}  # FluxTransformer2DModel.forward's names
REPO = Path(__file__).resolve().parent.parent
BLOCK_LISTS = {  # independent of the frontend's heuristic: the known block lists per class
    "transformer": ("transformer_blocks", "single_transformer_blocks"),
    "text_encoder": ("encoder.layers",),  # transformers 5: no text_model wrapper
    "text_encoder_2": ("encoder.block",),
    "vae": (),
}


@pytest.fixture(scope="module")
def tiny():
    return lower_file(str(REPO / "models" / "flux-tiny.dsl"))


def _build(component):
    module_name, _, cls_name = component.attrs["class"].rpartition(".")
    cls = getattr(importlib.import_module(module_name), cls_name)
    config = component.attrs["config"].to_python()
    torch.manual_seed(0)
    if module_name == "diffusers":
        return cls.from_config(config).eval()
    return cls(cls.config_class(**config)).eval()


def _random(ttype):
    dtype = getattr(torch, ttype.dtype)
    if dtype == torch.int64:
        return torch.randint(0, 100, ttype.shape)
    return torch.randn(ttype.shape, dtype=dtype)


@pytest.mark.parametrize("name", ["text_encoder", "text_encoder_2", "transformer", "vae"])
def test_declared_shapes_run_through_the_real_module(tiny, name: str) -> None:
    comp = tiny.component(name)
    model = _build(comp)
    kwargs = {i.name: _random(i.results[0].type) for i in comp.find(Op.INPUT)
              if not i.results[0].is_runtime}  # runtime values are Difflet's, not the reference's
    for table, ids in ROPE_TABLES.items():  # FLUX: the host's RoPE table stands for forward's ids
        if table in kwargs:
            tokens, width = kwargs.pop(table).shape
            # FluxPosEmbed gives cos and sin, each sum(axes_dims_rope) wide
            assert width == 2 * sum(model.config.axes_dims_rope), f"{table} width"
            kwargs[ids] = torch.zeros(tokens, 3)
    with torch.no_grad():
        out = getattr(model, comp.attrs["entry"])(**kwargs)
    for o in comp.find(Op.OUTPUT):
        sel = o.attrs["select"]
        got = out[sel] if isinstance(sel, int) else getattr(out, sel)
        assert tuple(got.shape) == o.results[0].type.shape
        assert str(got.dtype).removeprefix("torch.") == o.results[0].type.dtype


@pytest.mark.parametrize("name", sorted(BLOCK_LISTS))
def test_param_counts_equal_the_real_module(tiny, name: str) -> None:
    comp = tiny.component(name)
    model = _build(comp)
    assert comp.attrs["params"] == sum(p.numel() for p in model.parameters())
    linear = blocks = 0
    for path in BLOCK_LISTS[name]:
        blist = model.get_submodule(path)
        blocks += len(blist)
        linear += sum(p.numel() for m in blist.modules() if isinstance(m, torch.nn.Linear)
                      for p in m.parameters(recurse=False))
    assert comp.attrs["params_blocks_linear"] == linear
    assert comp.attrs["num_blocks"] == blocks
