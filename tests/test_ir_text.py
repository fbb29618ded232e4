"""The IR text form: exact round trips, a reviewed golden rendering, parse errors, `difflet show`.

Oracle: the hand-built Modules in tests/ir_samples.py (data equality plus exact Python types,
because Attrs equality alone treats True == 1 and 1 == 1.0).
"""
from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from difflet.cli import main
from difflet.errors import DiffletError
from difflet.ir.binary import save
from difflet.ir.nodes import Attrs, Loc, Module, Node, Op, RuntimeType, TensorType, Value
from difflet.ir.text import parse_module, print_module
from tests import ir_samples


def assert_identical(a, b) -> None:
    """Equal and of the same Python types all the way down (bool vs int vs float, -0.0)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, Attrs):
        assert a.keys() == b.keys()
        for (_, x), (_, y) in zip(a.items(), b.items()):
            assert_identical(x, y)
    elif isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_identical(x, y)
    elif isinstance(a, (Module, Node)):
        assert a == b
        assert_identical(a.attrs, b.attrs)
        assert_identical(a.body, b.body)
    elif isinstance(a, float):
        assert a == b and math.copysign(1, a) == math.copysign(1, b)
    else:
        assert a == b


@pytest.mark.parametrize("name", sorted(ir_samples.all_samples()))
def test_round_trip(name: str) -> None:
    module = ir_samples.all_samples()[name]
    text = print_module(module)
    back = parse_module(text)
    assert back == module
    assert_identical(back, module)
    assert print_module(back) == text


def test_lone_surrogate_and_control_chars_round_trip() -> None:
    attrs = Attrs(s="\ud800x\udfff", c="\x00\x7f\u2028", q='"\\')
    module = Module("m", "pipeline", attrs, ())
    text = print_module(module)
    text.encode("utf-8")  # still writable as UTF-8
    assert_identical(parse_module(text), module)


GOLDEN_SMALL = '''\
module @tiny level=pipeline {family = "flux", order = ["text", "visual"]} loc("m.dsl":1:1) {
  runtime @valid_text -> %valid_text : runtime<int64 in [1, 32]> {default = 32} loc("m.dsl":2:3)
  component @transformer {role = "denoiser", class = "diffusers.FluxTransformer2DModel"} loc("m.dsl":3:3) {
    input @t -> %t : tensor<float32> loc("m.dsl":4:5)
    input @valid_text(%valid_text) -> %valid_text : runtime<int64 in [1, 32]> loc(unknown)
    output @sample -> %sample : tensor<1x64x16xfloat32>, %"the aux" : tensor<2xbool> {select = 0} loc("m.dsl":6:5)
    attention @"transformer_blocks.*.attn" {kind = "joint", text_mask = false, x = none, f = 1.0} loc("m.dsl":7:5)
  }
  schedule @main loc("m.dsl":8:3) {
    step @flux.denoise(%transformer) {guidance = {mode = "embedded", scale = 3.5}} loc("m.dsl":9:5)
  }
}
'''


def _golden_module() -> Module:
    at = lambda line, col: Loc("m.dsl", line, col)  # noqa: E731
    rt = RuntimeType("int64", 1, 32)
    comp = Node(Op.COMPONENT, "transformer",
                Attrs({"role": "denoiser", "class": "diffusers.FluxTransformer2DModel"}), body=(
                    Node(Op.INPUT, "t", results=(Value("t", TensorType("float32", ())),), loc=at(4, 5)),
                    Node(Op.INPUT, "valid_text", args=("valid_text",), results=(Value("valid_text", rt),)),
                    Node(Op.OUTPUT, "sample", Attrs(select=0),
                         results=(Value("sample", TensorType("float32", (1, 64, 16))),
                                  Value("the aux", TensorType("bool", (2,)))), loc=at(6, 5)),
                    Node(Op.ATTENTION, "transformer_blocks.*.attn",
                         Attrs(kind="joint", text_mask=False, x=None, f=1.0), loc=at(7, 5)),
                ), loc=at(3, 3))
    sched = Node(Op.SCHEDULE, "main", loc=at(8, 3), body=(
        Node(Op.STEP, "flux.denoise", Attrs(guidance=Attrs(mode="embedded", scale=3.5)),
             args=("transformer",), loc=at(9, 5)),))
    return Module("tiny", "pipeline", Attrs(family="flux", order=("text", "visual")), (
        Node(Op.RUNTIME, "valid_text", Attrs(default=32), results=(Value("valid_text", rt),),
             loc=at(2, 3)),
        comp, sched), loc=at(1, 1))


def test_golden_rendering() -> None:
    assert print_module(_golden_module()) == GOLDEN_SMALL
    assert_identical(parse_module(GOLDEN_SMALL), _golden_module())


def test_layout_is_free_form_and_comments_are_ignored() -> None:
    squashed = " ".join(GOLDEN_SMALL.split())  # one line, single spaces
    assert_identical(parse_module(squashed), _golden_module())
    commented = GOLDEN_SMALL.replace("{\n", "{  // a note\n", 1).replace(
        "{default = 32}", "{\n      default = 32\n    }")
    assert commented != GOLDEN_SMALL
    assert_identical(parse_module(commented), _golden_module())


def test_long_attrs_wrap_and_still_round_trip() -> None:
    text = print_module(ir_samples.flux_like_module())
    assert "\n      role = \"denoiser\",\n" in text
    assert max(len(line) for line in text.split("\n") if "config" not in line) < 200


BAD = "module @m level=pipeline loc(unknown) {\n  %s\n}\n"


@pytest.mark.parametrize("line_text, line, col, message", [
    ("bogus @x loc(unknown)", 2, 3, "unknown op 'bogus'"),
    ("input @x -> %x : tensor<1x2xfloat32> {a = 1 b = 2} loc(unknown)", 2, 47,
     "expected ',', '}', got 'b'"),
    ("input @x {a = 1, a = 2} loc(unknown)", 2, 12, "duplicate attribute key 'a'"),
    ('input @x {a = "\\q"} loc(unknown)', 2, 17, "bad string literal"),
    ("input @x {a = #} loc(unknown)", 2, 17, "got '#'"),
    ('input @x loc("f":1)', 2, 21, "expected ':', got ')'"),
    ("input @x -> %x : tensor<1x2> loc(unknown)", 2, 20, "expected 'runtime', tensor<...>"),
    ("input @x -> %x : runtime<int64 in [1, 2.5]> loc(unknown)", 2, 42, "expected ']', got '.'"),
    ("input @x", 3, 1, "got '}'"),  # the next line's '}' arrives where loc(...) is due
])
def test_parse_error_points_at_line_and_column(line_text: str, line: int, col: int,
                                               message: str) -> None:
    text = BAD % line_text
    with pytest.raises(DiffletError) as info:
        parse_module(text, "edited.txt")
    err = info.value
    assert err.where == Loc("edited.txt", line, col)
    assert message in err.message
    assert err.snippet == text.split("\n")[line - 1].strip()
    assert err.__context__ is None and err.__cause__ is None  # no lark exception leaks


def test_parse_error_at_end_of_input() -> None:
    text = "module @m level=pipeline loc(unknown) {\n  input @x loc(unknown)\n"
    with pytest.raises(DiffletError) as info:
        parse_module(text, "cut.txt")
    assert info.value.where == Loc("cut.txt", 3, 1)
    assert "got end of input" in info.value.message
    with pytest.raises(DiffletError, match="expected 'module'"):
        parse_module("", "empty.txt")


def test_show_prints_binary_and_text_files(tmp_path) -> None:
    module = ir_samples.flux_like_module()
    save(module, tmp_path / "m.ir")
    save(module, tmp_path / "m.mlir")
    runner = CliRunner()
    for name in ("m.ir", "m.mlir"):
        result = runner.invoke(main, ["show", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        assert parse_module(result.stdout) == module


def test_show_garbage_exits_2_with_one_line(tmp_path) -> None:
    (tmp_path / "bad.ir").write_bytes(b"\x00\xffnot an ir file")
    (tmp_path / "bad.txt").write_text(BAD % "bogus @x loc(unknown)")
    runner = CliRunner()
    result = runner.invoke(main, ["show", str(tmp_path / "bad.ir")])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {tmp_path / 'bad.ir'}: neither binary IR")
    assert "Traceback" not in result.output
    result = runner.invoke(main, ["show", str(tmp_path / "bad.txt")])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {tmp_path / 'bad.txt'}:2:3: unknown op 'bogus'")
    assert runner.invoke(main, ["show"]).exit_code == 2  # usage error


def test_show_verify_flag(tmp_path) -> None:
    save(ir_samples.edge_module(), tmp_path / "edge.ir")
    runner = CliRunner()
    assert runner.invoke(main, ["show", str(tmp_path / "edge.ir")]).exit_code == 0
    result = runner.invoke(main, ["show", "--verify", str(tmp_path / "edge.ir")])
    assert result.exit_code == 2
    assert "verify [undefined-arg]" in result.stderr


def test_ir_modules_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = ("import sys, difflet.ir.text, difflet.ir.binary, difflet.ir.verify, "
            "difflet.ir.commands; sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
