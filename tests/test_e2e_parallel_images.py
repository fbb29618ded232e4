"""`difflet demo --parallel` for the images models: split rank programs compiled and served through the
real difflet-runtime equal the family's diffusers pipeline output (e2e_util.assert_parallel_serves_the_pipeline_output)."""
from __future__ import annotations

import pytest

from e2e_util import assert_parallel_serves_the_pipeline_output

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("model, args", [
    ("flux-tiny4", ("--parallel", "tp2cp2", "--attention", "ulysses")),
    ("qwen-image-tiny", ("--parallel", "tp2")),
    ("qwen-image-tiny", ("--parallel", "tp1cp2", "--attention", "ring")),
])
def test_demo_parallel_serves_the_pipeline_output(tmp_path, difflet_test_store, model, args):
    assert_parallel_serves_the_pipeline_output(tmp_path, difflet_test_store, model, args)
