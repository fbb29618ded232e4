"""`difflet demo --parallel` for the images models: split rank programs compiled and served through the
real difflet-runtime equal the TP1 demo's output (e2e_util.assert_parallel_serves_the_tp1_output)."""
from __future__ import annotations

import pytest

from e2e_util import assert_parallel_serves_the_tp1_output

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("model, args", [
    ("flux-tiny4", ("--parallel", "tp2cp2", "--attention", "ulysses")),
    ("qwen-image-tiny", ("--parallel", "tp2")),
    ("qwen-image-tiny", ("--parallel", "tp1cp2", "--attention", "ring")),
])
def test_demo_parallel_serves_the_tp1_output(tmp_path, difflet_test_store, tp1_demo, model, args):
    assert_parallel_serves_the_tp1_output(tmp_path, difflet_test_store, tp1_demo, model, args)
