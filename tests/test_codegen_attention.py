"""Difflet's Flux attention (eager) vs diffusers' own FluxTransformer2DModel of the same checkpoint."""
import pytest
import torch

from difflet.codegen.build import build_program_module, example_inputs
from difflet.errors import DiffletError
from difflet.ir.nodes import Op

from flux_oracle import program_and_diffusers_inputs


@pytest.fixture(scope="module")
def denoiser(flux_tiny_module, flux_tiny_ckpt):
    import diffusers

    node = flux_tiny_module.component("transformer")
    ref = diffusers.FluxTransformer2DModel.from_pretrained(str(flux_tiny_ckpt), subfolder="transformer").eval()
    return node, build_program_module(node, flux_tiny_ckpt), ref, program_and_diffusers_inputs(ref.config.axes_dims_rope,
                                                                       example_inputs(node))


def _text_len(node):
    return next(n.results[0].type.shape[1] for n in node.find(Op.INPUT) if n.name == "encoder_hidden_states")


@torch.no_grad()
def test_all_text_valid_equals_diffusers(denoiser):
    node, pm, ref, (x, d) = denoiser
    text_len = _text_len(node)
    ours = pm(*x[:-1], torch.tensor(text_len))[0]
    theirs = ref(*d[:-1], return_dict=False)[0]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("valid", [1, 5])
def test_fewer_valid_keys_equals_diffusers_with_a_key_mask(denoiser, valid):
    node, pm, ref, (x, d) = denoiser
    text_len = _text_len(node)
    seq = text_len + x[0].shape[1]
    # diffusers' processor order is [text, visual]; mask out text keys >= valid for every query.
    mask = torch.ones(1, 1, 1, seq, dtype=torch.bool)
    mask[..., valid:text_len] = False
    theirs = ref(*d[:-1], joint_attention_kwargs={"attention_mask": mask}, return_dict=False)[0]
    ours = pm(*x[:-1], torch.tensor(valid))[0]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ours, ref(*d[:-1], return_dict=False)[0], atol=1e-3)


def test_every_site_gets_the_difflet_processor(denoiser):
    from difflet.families.flux.programs import FluxBoundedAttnProcessor

    _, pm, ref, _ = denoiser
    sites = [n for n, m in pm.model.named_modules() if hasattr(m, "processor")]
    assert len(sites) == ref.config.num_layers + ref.config.num_single_layers
    assert all(isinstance(pm.model.get_submodule(n).processor, FluxBoundedAttnProcessor) for n in sites)


def test_a_site_glob_that_matches_nothing_is_refused(flux_tiny_module, flux_tiny_ckpt):
    node = flux_tiny_module.component("transformer")
    bad = tuple(n if n.op != Op.ATTENTION else type(n)(n.op, "blocks.*.attention", n.attrs, n.args,
                                                       n.results, n.body, n.loc) for n in node.body)
    node = type(node)(node.op, node.name, node.attrs, node.args, node.results, bad, node.loc)
    with pytest.raises(DiffletError, match="matches no module"):
        build_program_module(node, flux_tiny_ckpt)


def test_wrong_head_count_is_refused(flux_tiny_module, flux_tiny_ckpt):
    node = flux_tiny_module.component("transformer")
    bad = tuple(n if n.op != Op.ATTENTION else type(n)(n.op, n.name, n.attrs.set(heads=4), n.args,
                                                       n.results, n.body, n.loc) for n in node.body)
    node = type(node)(node.op, node.name, node.attrs, node.args, node.results, bad, node.loc)
    with pytest.raises(DiffletError, match="heads=2"):
        build_program_module(node, flux_tiny_ckpt)
