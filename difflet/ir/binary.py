"""The IR's binary form (`.ir` files) and the `save`/`load` helpers every tool uses.

Layout: MAGIC (b"DFLT") + format version (uint16, little endian) + a zstd frame holding the
msgpack encoding of the Module (msgspec; `Attrs` crosses as an ordered msgpack map).

Invariants:
- `decode(encode(m)) == m` exactly, attr key order and int/float/bool distinctions included.
- A wrong, truncated or corrupt file raises DiffletError naming the file, never a raw
  msgspec/zstd exception.
- Integers must fit msgpack (-2**63 .. 2**64-1); larger ones are an encode-time DiffletError.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import msgspec
import zstandard

from difflet.errors import DiffletError
from difflet.ir.nodes import Attrs, Module

MAGIC = b"DFLT"
VERSION = 1
_HEADER = struct.Struct("<4sH")
TEXT_SUFFIXES = (".txt", ".mlir")


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, Attrs):
        return dict(obj.items())  # dicts keep insertion order; msgpack maps keep it on the wire
    raise NotImplementedError(f"cannot encode {type(obj).__name__} in IR")


def _dec_hook(type_: type, obj: Any) -> Any:
    if type_ is Attrs and isinstance(obj, dict):
        return Attrs(obj)  # freeze() turns nested dicts/lists back into Attrs/tuples
    raise NotImplementedError(f"cannot decode {type_!r} from {type(obj).__name__}")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_DECODER = msgspec.msgpack.Decoder(Module, dec_hook=_dec_hook)


def encode(m: Module) -> bytes:
    """The binary form of `m`: header + zstd(msgpack(m))."""
    try:
        payload = _ENCODER.encode(m)
    except (OverflowError, TypeError, NotImplementedError, UnicodeEncodeError) as err:
        raise DiffletError(f"cannot encode module {m.name!r}: {err}", where=m.loc) from None
    return _HEADER.pack(MAGIC, VERSION) + zstandard.ZstdCompressor(level=9).compress(payload)


def decode(data: bytes, filename: str = "<bytes>") -> Module:
    """Read a Module back from `encode`'s bytes; DiffletError (naming `filename`) if it is not one."""
    if len(data) < _HEADER.size or data[:4] != MAGIC:
        raise DiffletError(f"not a Difflet IR file (expected magic {MAGIC!r})", where=filename)
    _, version = _HEADER.unpack_from(data)
    if version != VERSION:
        raise DiffletError(f"IR format version {version} is not supported (this Difflet reads "
                           f"version {VERSION}); re-run the tool that wrote it", where=filename)
    try:
        payload = zstandard.ZstdDecompressor().decompress(data[_HEADER.size:])
    except zstandard.ZstdError as err:
        raise DiffletError(f"truncated or corrupt IR file ({err})", where=filename) from None
    try:
        return _DECODER.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as err:
        raise DiffletError(f"corrupt IR file: {err}", where=filename) from None


def save(m: Module, path: str | Path) -> None:
    """Write `m` to `path`: text if it ends in .txt or .mlir, else the binary form."""
    path = Path(path)
    if path.suffix in TEXT_SUFFIXES:
        from difflet.ir.printer import print_module

        data = print_module(m).encode("utf-8")
    else:
        data = encode(m)
    try:
        path.write_bytes(data)
    except OSError as err:
        raise DiffletError(f"cannot write IR: {err.strerror}", where=str(path)) from None


def load(path: str | Path) -> Module:
    """Read a Module from `path`, binary (by its magic) or hand-editable text."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DiffletError(f"cannot read IR: {err.strerror}", where=str(path)) from None
    if data[:4] == MAGIC:
        return decode(data, str(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DiffletError(f"neither binary IR (no {MAGIC!r} magic) nor UTF-8 text IR "
                           f"(bad byte at offset {err.start})", where=str(path)) from None
    from difflet.ir.parser import parse_module

    return parse_module(text, str(path))
