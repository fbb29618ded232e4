"""The IR binary form and save/load: exact round trips, clear errors for bad files.

Oracle: the hand-built Modules in tests/ir_samples.py, compared with exact Python types.
"""
from __future__ import annotations

import struct

import msgspec
import pytest
import zstandard

from difflet.errors import DiffletError
from difflet.ir.binary import MAGIC, VERSION, _dec_hook, _enc_hook, decode, encode, load, save
from difflet.ir.nodes import Attrs, Module
from difflet.ir.text import parse_module, print_module
from tests import ir_samples
from tests.test_ir_text import assert_identical


@pytest.mark.parametrize("name", sorted(ir_samples.all_samples()))
def test_round_trip(name: str) -> None:
    module = ir_samples.all_samples()[name]
    data = encode(module)
    assert data[:4] == MAGIC
    back = decode(data)
    assert_identical(back, module)
    assert print_module(back) == print_module(module)


def test_attrs_hooks_round_trip_through_msgpack() -> None:
    attrs = Attrs(b=1, a=(True, 1.0, None, Attrs(z=Attrs(), y=())), c="x")
    raw = msgspec.msgpack.encode(attrs, enc_hook=_enc_hook)
    back = msgspec.msgpack.decode(raw, type=Attrs, dec_hook=_dec_hook)
    assert_identical(back, attrs)
    assert back.keys() == ["b", "a", "c"]  # order is part of equality


@pytest.mark.parametrize("data, message", [
    (b"", "not a Difflet IR file"),
    (b"PK\x03\x04whatever", "not a Difflet IR file"),
    (struct.pack("<4sH", MAGIC, VERSION + 1) + b"x", f"format version {VERSION + 1}"),
    (struct.pack("<4sH", MAGIC, VERSION) + b"\x28\xb5\x2f", "truncated or corrupt"),
    (struct.pack("<4sH", MAGIC, VERSION) + zstandard.ZstdCompressor().compress(b"\x93\x01\x02\x03"),
     "corrupt IR file"),
])
def test_bad_bytes_name_the_file(data: bytes, message: str) -> None:
    with pytest.raises(DiffletError) as info:
        decode(data, "some/file.ir")
    assert info.value.where == "some/file.ir"
    assert message in info.value.message


def test_truncated_file_is_reported() -> None:
    data = encode(ir_samples.flux_like_module())
    for cut in (5, 7, len(data) // 2, len(data) - 1):
        with pytest.raises(DiffletError) as info:
            decode(data[:cut], "file.ir")
        assert info.value.where == "file.ir"


def test_unencodable_values_are_a_clear_error() -> None:
    too_big = Module("m", "pipeline", Attrs(n=2**70), ())
    with pytest.raises(DiffletError, match="cannot encode module 'm'"):
        encode(too_big)
    surrogate = Module("m", "pipeline", Attrs(s="\ud800"), ())
    with pytest.raises(DiffletError, match="cannot encode"):
        encode(surrogate)


def test_save_picks_the_form_by_suffix_and_load_detects_it(tmp_path) -> None:
    module = ir_samples.flux_like_module()
    for name in ("m.ir", "m.bin"):
        save(module, tmp_path / name)
        assert (tmp_path / name).read_bytes()[:4] == MAGIC
        assert_identical(load(tmp_path / name), module)
    for name in ("m.txt", "m.mlir"):
        save(module, tmp_path / name)
        assert (tmp_path / name).read_text(encoding="utf-8") == print_module(module)
        assert_identical(load(tmp_path / name), module)
    # a hand-edited text file under a binary name still loads
    (tmp_path / "edited.ir").write_text(print_module(module).replace("steps = 4", "steps = 8"))
    assert load(tmp_path / "edited.ir").attrs["profile"]["steps"] == 8


def test_load_errors_name_the_path(tmp_path) -> None:
    with pytest.raises(DiffletError) as info:
        load(tmp_path / "missing.ir")
    assert info.value.where == str(tmp_path / "missing.ir")
    (tmp_path / "bad.txt").write_text("module @m level=pipeline loc(unknown) {\n  nope\n}\n")
    with pytest.raises(DiffletError) as info:
        load(tmp_path / "bad.txt")
    assert str(info.value.where) == f"{tmp_path / 'bad.txt'}:3:1"
    with pytest.raises(DiffletError) as info:
        save(ir_samples.empty_module(), tmp_path / "no_dir" / "m.ir")
    assert info.value.where == str(tmp_path / "no_dir" / "m.ir")


def test_text_and_binary_agree() -> None:
    module = ir_samples.edge_module()
    assert_identical(decode(encode(parse_module(print_module(module)))), module)
