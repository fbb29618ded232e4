"""Block mode's front and rest programs equal the whole denoiser, for every family (eager, fp32).

Oracle: the unsplit program module of the same checkpoint (the family wrapper over the whole
diffusers model, what an unsplit program compiles). The tiny descriptions are float32, and the
two halves run the same modules in the same order, so the only difference is the residual add
and subtract on the tail streams: a float32 rounding of values of order 1, hence the 1e-5 bound
(one wrong block, stream or missing modulation is off by order 1).
"""
from __future__ import annotations

import pytest
import torch

from conftest import REPO
from difflet.ir.nodes import Op, RuntimeType
from oracle_util import random_checkpoint

TINY = ("flux-tiny", "qwen-image-tiny", "wan2.1-tiny", "hunyuan-video-tiny", "ltx2-tiny")


# ltx2-tiny has one block, which cannot be cut: the same model with two
TWO_LTX2_BLOCKS = ("audio_cross_attention_dim: 16, num_layers: 1", "audio_cross_attention_dim: 16, num_layers: 2")


@pytest.fixture(scope="module", params=TINY)
def denoiser(request, tmp_path_factory):
    """(denoiser node, checkpoint, example inputs) of one tiny model."""
    from difflet.frontend.lower import lower_file
    from difflet.passes.pipeline import optimize

    path = REPO / "models" / f"{request.param}.dsl"
    if request.param == "ltx2-tiny":
        text = path.read_text()
        assert text.count(TWO_LTX2_BLOCKS[0]) == 1
        path = tmp_path_factory.mktemp("ltx2") / "ltx2-tiny-2.dsl"
        path.write_text(text.replace(*TWO_LTX2_BLOCKS))
    module = optimize(lower_file(str(path)), parallel="tp1", target="cpu", backend="inductor")
    node = [c for c in module.components() if c.attrs.get("role") == "denoiser"][0]
    gen = torch.Generator().manual_seed(0)
    inputs = []
    for n in node.find(Op.INPUT):
        t = n.results[0].type
        if isinstance(t, RuntimeType):
            inputs.append(torch.tensor(t.hi))
        elif n.name == "timestep":
            inputs.append(torch.rand(t.shape, generator=gen) * 0.8 + 0.1)
        else:
            inputs.append(torch.randn(t.shape, generator=gen).to(getattr(torch, t.dtype)))
    return node, random_checkpoint(module), tuple(inputs)


def _parts(node, ckpt, k):
    from difflet.codegen.block_programs import FRONT, REST
    from difflet.codegen.blocks import BlockModule
    from difflet.codegen.build import build_program_module
    from difflet.codegen.declarations import declaration

    decl = declaration(node.attrs["class"]).blocks
    return (BlockModule(build_program_module(node, ckpt), decl, k, FRONT),
            BlockModule(build_program_module(node, ckpt), decl, k, REST), decl)


def _total_blocks(node, ckpt) -> int:
    from difflet.codegen.blocks import block_list
    from difflet.codegen.build import build_program_module
    from difflet.codegen.declarations import declaration

    return len(block_list(build_program_module(node, ckpt).model, declaration(node.attrs["class"]).blocks))


def test_front_then_rest_equal_the_whole_denoiser(denoiser):
    from difflet.codegen.blocks import stream_shapes
    from difflet.codegen.build import build_program_module

    node, ckpt, inputs = denoiser
    n_out = len(node.find(Op.OUTPUT))
    with torch.no_grad():
        whole = build_program_module(node, ckpt)(*inputs)
        for k in sorted({1, _total_blocks(node, ckpt) - 1}):  # the first cut and the last
            front, rest, decl = _parts(node, ckpt, k)
            shapes = stream_shapes(front, inputs)
            assert len(shapes) == len(decl.outputs)
            zeros = [torch.zeros(shapes[decl.outputs.index(s)][0], dtype=shapes[decl.outputs.index(s)][1])
                     for s in decl.tail]
            out = front(*inputs, *zeros)
            streams = out[n_out:]
            assert [(tuple(s.shape), s.dtype) for s in streams] == shapes
            done = rest(*inputs, *streams)
            assert len(done) == n_out + len(decl.tail)
            for got, want in zip(done[:n_out], whole, strict=True):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
            # the front with the rest's residuals gives the whole output too (a skipped step's
            # estimate is exact when the residual has not changed)
            again = front(*inputs, *done[n_out:])
            for got, want in zip(again[:n_out], whole, strict=True):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_parts_keep_only_their_blocks_weights(denoiser):
    from difflet.codegen.build import build_program_module

    node, ckpt, _ = denoiser
    whole = set(build_program_module(node, ckpt).state_dict())
    front, rest, decl = _parts(node, ckpt, 1)
    f, r = set(front.pm.state_dict()), set(rest.pm.state_dict())
    assert f | r == whole  # nothing renamed, nothing lost
    first = f".{decl.stacks[0]}.0."  # e.g. model.transformer_blocks.0.*, not single_transformer_blocks
    assert any(first in f".{k}" for k in f) and not any(first in f".{k}" for k in r)
    shared = f & r  # embeddings and output layers only: no block's weights in both
    assert not any(f".{stack}." in f".{k}" for k in shared for stack in decl.stacks)


def test_cut_out_of_range_is_refused(denoiser):
    from difflet.errors import DiffletError

    node, ckpt, _ = denoiser
    n = _total_blocks(node, ckpt)
    for k in (0, n):
        with pytest.raises(DiffletError, match=rf"front_blocks {k} must be in \[1, {n - 1}\]"):
            _parts(node, ckpt, k)
