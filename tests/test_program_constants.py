"""A compiled program carries no checkpoint value: every tensor it reads is a constant loaded at run
time, so the store may serve one program for every checkpoint of the same config (its cache key
leaves weights out).

Found in the full suite: inductor inlined small tensors (an AutoencoderKL/AutoencoderKLWan decoder's
3-element conv_out bias, 4- and 8-element biases) into the generated code, so a program compiled
from one checkpoint decoded another checkpoint's latents with the first one's biases (a Wan video
19 dB from WanPipeline's). Oracle: the eager program module of the second checkpoint.
"""
from __future__ import annotations

import pytest
import torch

from conftest import REPO, shared_store_dir
from oracle_util import planned_tiny, random_checkpoint

pytestmark = pytest.mark.slow  # compiles one decoder


def test_a_program_compiled_from_one_checkpoint_serves_another(tmp_path):
    from safetensors.torch import save_file

    from difflet.codegen.build import build_program_module, example_inputs
    from difflet.codegen.checkpoint import resolve_weights
    from difflet.codegen.inductor import PROGRAM_FILE, CompiledRunner, compile_entry, program_weights

    module = planned_tiny(REPO / "models" / "flux-tiny.dsl")
    node = module.component("vae")
    compiled_from = build_program_module(node, random_checkpoint(module))
    served = build_program_module(node, resolve_weights(module, "random:1", shared_store_dir()))
    small = [k for k, v in served.named_parameters() if v.numel() <= 8]
    assert "model.decoder.conv_out.bias" in small  # what inductor used to inline
    compile_entry(node, compiled_from, tmp_path)
    save_file(program_weights(served, tmp_path), str(tmp_path / "served.safetensors"))
    program = CompiledRunner(tmp_path / PROGRAM_FILE, tmp_path / "served.safetensors")
    torch.manual_seed(0)
    (z,) = [torch.randn_like(t) for t in example_inputs(node)]
    with torch.no_grad():
        got, want, other = program(z)[0], served(z)[0], compiled_from(z)[0]
    assert (want - other).abs().max() > 0.1  # the two checkpoints decode differently
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
