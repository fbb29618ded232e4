"""`difflet demo --parallel` for the videos models: split rank programs compiled and served through the
real difflet-runtime equal the family's diffusers pipeline output (e2e_util.assert_parallel_serves_the_pipeline_output)."""
from __future__ import annotations

import pytest

from e2e_util import assert_parallel_serves_the_pipeline_output

pytestmark = pytest.mark.slow


# Wan's TP rank programs are served equal to WanPipeline by tests/test_wan22.py (tp2, the same
# WanTransformer3DModel rank code) and compiled at tp2cp2+sp by tests/test_split_wan.py, so Wan's
# demo here is its CP layout only; LTX-2's CP ring rank programs are compiled and served equal to
# TP1 by tests/test_split_ltx2.py (COMPILED), so its demo here is tp2 only (the suite's time bound).
@pytest.mark.parametrize("model, args", [
    ("wan2.1-tiny", ("--parallel", "tp1cp2", "--attention", "ring")),  # rank programs shared with test_split_wan
    ("hunyuan-video-tiny", ("--parallel", "tp2")),
    ("hunyuan-video-tiny", ("--parallel", "tp1cp2", "--attention", "ulysses")),
    ("ltx2-tiny", ("--parallel", "tp2")),
])
def test_demo_parallel_serves_the_pipeline_output(tmp_path, difflet_test_store, model, args):
    assert_parallel_serves_the_pipeline_output(tmp_path, difflet_test_store, model, args)
