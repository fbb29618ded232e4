"""RoPE without float64 in any graph, against diffusers' own float64 tables.

FLUX: no RoPE runs in its denoiser graph. The host computes the tables with diffusers' own
FluxPosEmbed on the ids FluxPipeline builds (difflet/families/flux/host.py `rope_tables`) and the
program takes them as inputs (programs.py `FluxProgram`), so the program must equal diffusers'
FluxTransformer2DModel.forward on the ids bit for bit, and its exported graph must hold no float64
value and no cos/sin. (The float32 in-graph replacement this replaced differed by up to 6e-8.)
LTX-2 keeps codegen/rope.py's replacement: its frequencies come from the host's float64 values,
so its tables must be bit-identical to diffusers' (the LTX-2 oracle test compares video exactly).
"""
from __future__ import annotations

import copy

import pytest
import torch

from difflet.codegen.rope import install_fp32_rope

REPO_DSL = "models/flux-tiny.dsl"


def _pipeline_ids(rows: int, cols: int, text: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(txt_ids, img_ids) as FluxPipeline builds them (pipeline_flux.py encode_prompt / prepare_latents)."""
    from diffusers import FluxPipeline

    return (torch.zeros(text, 3).to(dtype=dtype),
            FluxPipeline._prepare_latent_image_ids(1, rows, cols, torch.device("cpu"), dtype))


@pytest.mark.parametrize("axes, rows, cols, dtype", [([16, 56, 56], 128, 96, torch.bfloat16),
                                                     ([4, 6, 6], 6, 6, torch.float32)])
def test_flux_host_tables_are_diffusers_pos_embed_bit_for_bit(axes, rows, cols, dtype):
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    from difflet.families.flux.host import rope_tables
    from difflet.families.flux.programs import FluxRopeTable

    txt_ids, img_ids = _pipeline_ids(rows, cols, 24, dtype)
    # what FluxTransformer2DModel.forward computes: pos_embed(cat((txt_ids, img_ids)))
    cos, sin = FluxPosEmbed(10000, axes)(torch.cat((txt_ids, img_ids), dim=0))
    img, txt = rope_tables(tuple(axes), rows, cols, 24, dtype, dtype)
    assert img.dtype == txt.dtype == torch.float32
    assert img.shape == (rows * cols, 2 * sum(axes)) and txt.shape == (24, 2 * sum(axes))
    got_cos, got_sin = FluxRopeTable()(torch.cat((txt, img), dim=0))
    assert torch.equal(got_cos, cos) and torch.equal(got_sin, sin)


def _flux_tiny_transformer():
    """flux-tiny's transformer node and a seeded random FluxTransformer2DModel of its config."""
    from diffusers import FluxTransformer2DModel

    from difflet.frontend.lower import lower_file

    node = lower_file(REPO_DSL).component("transformer")
    torch.manual_seed(0)
    return node, FluxTransformer2DModel(**node.attrs["config"].to_python()).eval()


def test_flux_program_is_diffusers_forward_on_the_ids_bit_for_bit():
    """The wrapper alone (diffusers' own attention processors kept): exactly diffusers' forward."""
    from difflet.codegen.build import example_inputs
    from difflet.codegen.program import program_inputs
    from difflet.families.flux.host import rope_tables
    from difflet.families.flux.programs import FluxProgram

    node, model = _flux_tiny_transformer()
    names = [v.name for v in program_inputs(node)]
    values = dict(zip(names, example_inputs(node)))
    values["img_rope"], values["txt_rope"] = rope_tables((4, 6, 6), 8, 8, 32, torch.float32, torch.float32)
    txt_ids, img_ids = _pipeline_ids(8, 8, 32, torch.float32)
    kwargs = {k: v for k, v in values.items() if k not in ("img_rope", "txt_rope", "valid_text")}
    with torch.no_grad():
        want = model(**kwargs, img_ids=img_ids, txt_ids=txt_ids, return_dict=False)[0]
        got = FluxProgram(copy.deepcopy(model), node)(*[values[n] for n in names if n != "valid_text"],
                                                     torch.tensor(32))
    assert torch.equal(got[0], want)


def test_flux_denoiser_graph_has_no_float64_and_no_rope_trig():
    """The program as codegen builds it (Difflet attention, wrapper), exported as inductor does."""
    from difflet.codegen.build import example_inputs, wrap_program_module

    node, model = _flux_tiny_transformer()
    pm = wrap_program_module(model, node)
    ep = torch.export.export(pm, example_inputs(node), strict=False)
    values = [n.meta["val"] for n in ep.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert values and all(v.dtype != torch.float64 for v in values)
    calls = [n for n in ep.graph.nodes if n.op == "call_function" and str(n.target).startswith("aten.")]
    trig = [n for n in calls if str(n.target).split(".")[1] in ("cos", "sin", "outer", "polar", "repeat_interleave")]
    # the only trig left is the sinusoidal timestep/guidance embedding (diffusers' get_timestep_embedding)
    where = {n.meta.get("stack_trace", "").strip().splitlines()[-1].strip() for n in trig}
    assert where == {"t_emb = get_timestep_embedding("}, where
    assert not [n for n in calls if "get_1d_rotary_pos_embed(" in n.meta.get("stack_trace", "")]  # diffusers' RoPE


def test_flux_program_refuses_position_id_inputs():
    from difflet.errors import DiffletError
    from difflet.families.flux.programs import FluxProgram
    from difflet.frontend.lower import lower_text
    from pathlib import Path

    text = Path(REPO_DSL).read_text().replace("input img_rope:              float32[(height / 4) * (width / 4), "
                                              "2 * transformer.attention_head_dim]",
                                              "input img_ids:               dtype[(height / 4) * (width / 4), 3]")
    node = lower_text(text, "old.dsl").component("transformer")
    _, model = _flux_tiny_transformer()
    with pytest.raises(DiffletError, match="img_rope and txt_rope .*missing \\['img_rope'\\], has \\['img_ids'\\]"):
        FluxProgram(model, node)


@pytest.mark.parametrize("rope_type", ["interleaved", "split"])
def test_ltx2_rope_equals_diffusers_float64_tables_and_exports_without_float64(rope_type):
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoRotaryPosEmbed

    ref = LTX2AudioVideoRotaryPosEmbed(dim=4096, rope_type=rope_type, modality="video")
    coords = ref.prepare_video_coords(1, 8, 16, 24, device=torch.device("cpu"))
    want = ref(coords)
    mine = copy.deepcopy(ref)
    assert install_fp32_rope(torch.nn.ModuleList([mine])) == 1
    got = mine(coords)
    for w, g in zip(want, got, strict=True):
        assert torch.equal(g, w)  # the host computes exactly what diffusers computes

    class Call(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rope = mine

        def forward(self, c):
            return self.rope(c)

    ep = torch.export.export(Call(), (coords,), strict=False)
    assert all(n.meta["val"].dtype != torch.float64 for n in ep.graph.nodes
               if isinstance(n.meta.get("val"), torch.Tensor))


def test_ltx2_connector_rope_is_replaced():
    from diffusers.pipelines.ltx2.connectors import LTX2RotaryPosEmbed1d

    ref = LTX2RotaryPosEmbed1d(dim=128, base_seq_len=4096, theta=10000.0)
    want = ref(1, 64, device=torch.device("cpu"))
    mine = copy.deepcopy(ref)
    assert install_fp32_rope(torch.nn.ModuleList([mine])) == 1
    for w, g in zip(want, mine(1, 64, device=torch.device("cpu")), strict=True):
        assert torch.equal(g, w)  # the host computes exactly what diffusers computes
