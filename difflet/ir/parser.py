"""Text -> IR: reads what `printer.print_module` writes (grammar: grammars/ir.lark).

Invariants:
- `parse_module(print_module(m)) == m` exactly (see printer.py).
- Every malformed input raises `DiffletError` with `where=Loc(filename, line, col)` of the IR
  text and the offending line as snippet; no lark exception ever escapes.
"""
from __future__ import annotations

import functools
import json
from typing import Any

import lark
from lark import Token, Transformer, v_args

from difflet.bundled import GRAMMARS_DIR
from difflet.errors import DiffletError
from difflet.ir.nodes import Attrs, Loc, Module, Node, Op, RuntimeType, TensorType, Value

GRAMMAR = GRAMMARS_DIR / "ir.lark"
_OPS = {op.value: op for op in Op}

# readable names for the grammar's terminals in "expected ..." messages
_TERMINALS = {
    "IDENT": "identifier", "STRING": "string", "INT": "integer", "FLOAT": "float",
    "TENSOR_TYPE": "tensor<...>", "LBRACE": "'{'", "RBRACE": "'}'", "LPAR": "'('",
    "RPAR": "')'", "LSQB": "'['", "RSQB": "']'", "COMMA": "','", "EQUAL": "'='",
    "COLON": "':'", "AT": "'@'", "PERCENT": "'%'", "LESSTHAN": "'<'", "MORETHAN": "'>'",
    "__ANON_0": "'->'", "$END": "end of input",
}


@functools.lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    return lark.Lark(GRAMMAR.read_text(), parser="lalr", lexer="contextual",
                     propagate_positions=True, maybe_placeholders=False)


def _unquote(tok: Token) -> str:
    try:
        return json.loads(tok)
    except ValueError as err:
        raise _ParseFailure(f"bad string literal {tok}: {err.msg}", tok.line, tok.column) from None


class _ParseFailure(Exception):
    """Raised inside the transformer; turned into a DiffletError with the line as snippet."""

    def __init__(self, message: str, line: int, col: int) -> None:
        super().__init__(message)
        self.message, self.line, self.col = message, line, col


def _tensor_type(tok: Token) -> TensorType:
    inner = tok[len("tensor<"):-1]
    dims: list[int] = []
    # dims are `<int>x` prefixes; the rest is the dtype (an identifier or a quoted string)
    while inner[:1] == "-" or inner[:1].isdigit():
        num, _, inner = inner.partition("x")
        dims.append(int(num))
    dtype = _unquote(Token("STRING", inner, line=tok.line, column=tok.column)) \
        if inner.startswith('"') else inner
    return TensorType(dtype, tuple(dims))


@v_args(inline=True)
class _ToIR(Transformer):
    def start(self, module: Module) -> Module:
        return module

    # -- words and values
    def ident(self, tok: Token) -> str:
        return str(tok)

    def string(self, tok: Token) -> str:
        return _unquote(tok)

    def int(self, tok: Token) -> int:
        return int(tok)

    def float(self, tok: Token) -> float:
        return float(tok)

    def true(self) -> bool:
        return True

    def false(self) -> bool:
        return False

    def none(self) -> None:
        return None

    def tuple(self, *items: Any) -> tuple:
        return tuple(items)

    def attr(self, key: str, value: Any) -> tuple[str, Any]:
        return (key, value)

    @v_args(meta=True)
    def attrs(self, meta: Any, items: list) -> Attrs:
        keys = [k for k, _ in items]
        dup = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
        if dup is not None:
            raise _ParseFailure(f"duplicate attribute key {dup!r}", meta.line, meta.column)
        return Attrs(items)

    # -- types, values, locations
    def tensor_type(self, tok: Token) -> TensorType:
        return _tensor_type(tok)

    def runtime_type(self, dtype: str, lo: Token, hi: Token) -> RuntimeType:
        return RuntimeType(dtype, int(lo), int(hi))

    def sym(self, name: str) -> str:
        return name

    def valref(self, name: str) -> str:
        return name

    def result(self, name: str, type_: Any) -> Value:
        return Value(name, type_)

    def results(self, *values: Value) -> tuple:
        return ("results", tuple(values))

    def args(self, *names: str) -> tuple:
        return ("args", tuple(names))

    def body(self, *nodes: Node) -> tuple:
        return ("body", tuple(nodes))

    def loc_unknown(self) -> Loc:
        return Loc.unknown()

    def loc_known(self, file: Token, line: Token, col: Token) -> Loc:
        return Loc(_unquote(file), int(line), int(col))

    # -- nodes
    @v_args(meta=True)
    def node(self, meta: Any, children: list) -> Node:
        op_tok, name, *rest = children
        if str(op_tok) not in _OPS:
            known = ", ".join(sorted(_OPS))
            raise _ParseFailure(f"unknown op {str(op_tok)!r} (known: {known})",
                                op_tok.line, op_tok.column)
        parts: dict[str, Any] = {}
        for part in rest:
            if isinstance(part, Attrs):
                parts["attrs"] = part
            elif isinstance(part, Loc):
                parts["loc"] = part
            else:
                parts[part[0]] = part[1]
        return Node(_OPS[str(op_tok)], name, **parts)

    def module(self, name: str, level: str, *rest: Any) -> Module:
        attrs = next((r for r in rest if isinstance(r, Attrs)), Attrs())
        loc = next(r for r in rest if isinstance(r, Loc))
        body = tuple(r for r in rest if isinstance(r, Node))
        return Module(name, level, attrs, body, loc)


def _snippet(text: str, line: int) -> str | None:
    lines = text.split("\n")
    return lines[line - 1].strip() if 1 <= line <= len(lines) else None


def _describe(token: Token) -> str:
    if token.type == "$END":
        return "end of input"
    return repr(str(token))


def _expected(names: Any) -> str:
    shown = sorted({_TERMINALS.get(n, repr(n.lower()) if n.isupper() else n) for n in names})
    return ", ".join(shown) if shown else "nothing"


def parse_module(text: str, filename: str = "<text>") -> Module:
    """Parse the text form of a Module. Raises DiffletError at the offending line:col."""
    try:
        tree = _parser().parse(text)
        return _ToIR().transform(tree)
    except lark.exceptions.UnexpectedToken as err:
        line, col = err.line, err.column
        if err.token.type == "$END":
            line, col = text.count("\n") + 1, len(text.split("\n")[-1]) + 1
        message = f"expected {_expected(err.accepts or err.expected)}, got {_describe(err.token)}"
    except lark.exceptions.UnexpectedCharacters as err:
        line, col = err.line, err.column
        message = f"expected {_expected(err.allowed)}, got {text[err.pos_in_stream]!r}"
    except lark.exceptions.UnexpectedEOF as err:
        line, col = text.count("\n") + 1, len(text.split("\n")[-1]) + 1
        message = f"expected {_expected(err.expected)}, got end of input"
    except lark.exceptions.VisitError as err:
        if not isinstance(err.orig_exc, _ParseFailure):
            raise
        line, col, message = err.orig_exc.line, err.orig_exc.col, err.orig_exc.message
    raise DiffletError(message, where=Loc(filename, line, col), snippet=_snippet(text, line))
