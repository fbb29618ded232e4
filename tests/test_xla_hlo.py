"""bench/xla_hlo.py, the float64 counter of the opt-in XLA check, on HLO text samples.

Oracle: hand-read HLO in the two spellings torch_xla prints (with and without `%` names); the
check itself (bench/xla_check.py) needs torch-xla and is not part of this suite.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "xla_hlo.py"
_spec = importlib.util.spec_from_file_location("xla_hlo", BENCH)
xla_hlo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(xla_hlo)

WITH_F64 = """HloModule IrToHlo.14, entry_computation_layout={(f32[4]{0}, s64[])->(f32[4]{0})}

ENTRY %IrToHlo.14 (p0.1: f32[4], p1.2: s64[]) -> (f32[4]) {
  %p0.1 = f32[4]{0} parameter(0)
  %convert.3 = f64[4]{0} convert(f32[4]{0} %p0.1)
  %constant.4 = f64[] constant(3)
  %broadcast.5 = f64[4]{0} broadcast(f64[] %constant.4), dimensions={}
  %multiply.6 = f64[4]{0} multiply(f64[4]{0} %convert.3, f64[4]{0} %broadcast.5)
  %pair.9 = (f32[4]{0}, c128[2]{0}) tuple(f32[4]{0} %p0.1, c128[2]{0} %c.1)
  %convert.7 = f32[4]{0} convert(f64[4]{0} %multiply.6)
  ROOT %tuple.8 = (f32[4]{0}) tuple(f32[4]{0} %convert.7)
}
"""

CLEAN = """HloModule IrToHlo.9, entry_computation_layout={(f32[2,3]{1,0}, s64[])->(f32[2,3]{1,0})}

ENTRY IrToHlo.9 {
  p0.1 = f32[2,3]{1,0} parameter(0)
  p1.2 = s64[] parameter(1)
  convert.3 = f32[] convert(p1.2)
  broadcast.4 = f32[2,3]{1,0} broadcast(convert.3), dimensions={}
  ROOT multiply.5 = f32[2,3]{1,0} multiply(p0.1, broadcast.4)
}
"""


def test_float64_results_are_counted_by_opcode():
    found = xla_hlo.count_f64(WITH_F64)
    assert found["ops"] == 5  # convert, constant, broadcast, multiply, and the tuple holding c128
    assert found["opcodes"] == {"convert": 1, "constant": 1, "broadcast": 1, "multiply": 1, "tuple": 1}
    assert found["examples"][0] == "convert.3 = f64[4]{0} convert"
    assert found["mentions"] > found["ops"]  # operands count as mentions, not as ops


def test_a_float32_program_is_clean():
    assert xla_hlo.count_f64(CLEAN) == {"ops": 0, "mentions": 0, "opcodes": {}, "examples": []}
    names = [n for n, _, _ in xla_hlo.instructions(CLEAN)]
    assert names == ["p0.1", "p1.2", "convert.3", "broadcast.4", "multiply.5"]


def test_debug_metadata_names_the_aten_op_and_entry_parameters_are_counted():
    line = ('  %constant.760 = f64[] constant(0.5), metadata={op_type="aten__upsample_nearest2d" '
            'op_name="aten__upsample_nearest2d" source_file="/v/lib/python3.11/site-packages/torch/nn/'
            'functional.py" source_line=4726}')
    found = xla_hlo.count_f64(f"HloModule m\n\nENTRY %m {{\n{line}\n}}\n")
    assert found["examples"] == ["constant.760 = f64[] constant from aten__upsample_nearest2d "
                                 "(torch/nn/functional.py:4726)"]
    reducer = "%Add.1 (x.2: f32[], y.3: f32[]) -> f32[] {\n  %x.2 = f32[] parameter(0)\n  %y.3 = f32[] parameter(1)\n}\n"
    assert xla_hlo.parameters(reducer + CLEAN) == 2 and xla_hlo.parameters(WITH_F64) == 1
