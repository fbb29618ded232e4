"""DSL text -> `ModelDecl` AST (grammars/difflet.lark, LALR, positions propagated).

Invariants:
- A syntax error becomes a `DiffletError` at `file:line:col` with the offending source line as
  its snippet; nothing else escapes from `parse_text`.
- The AST is purely syntactic: names are not resolved and expressions are not evaluated here.
"""
from __future__ import annotations

import functools

import lark
from lark import Token, Transformer, v_args

from difflet.bundled import GRAMMARS_DIR
from difflet.errors import DiffletError
from difflet.frontend import ast
from difflet.ir.nodes import Loc

GRAMMAR = GRAMMARS_DIR / "difflet.lark"


@functools.lru_cache(maxsize=1)
def _parser() -> lark.Lark:
    return lark.Lark(GRAMMAR.read_text(), parser="lalr", lexer="contextual",
                     propagate_positions=True, maybe_placeholders=True)


def _span(meta) -> ast.Span:
    return ast.Span(meta.line, meta.column, meta.start_pos, meta.end_pos)


def _tok_span(tok: Token) -> ast.Span:
    return ast.Span(tok.line, tok.column, tok.start_pos, tok.end_pos)


def _string(tok: Token) -> str:
    import json

    return json.loads(tok)  # ESCAPED_STRING is a JSON-compatible string literal


def _number(tok: Token) -> int | float:
    text = str(tok)
    return float(text) if any(c in text for c in ".eE") else int(text)


def _binop(op: str):
    def rule(self, meta, c):
        return ast.BinOp(op, c[0], c[1], _span(meta))
    return rule


@v_args(meta=True)
class _ToAst(Transformer):
    """Builds AST nodes bottom-up; rule names match grammars/difflet.lark."""

    # ---- expressions and values
    def number(self, meta, c):
        return ast.Num(_number(c[0]), _tok_span(c[0]))

    def ref(self, meta, c):
        return ast.Ref(str(c[0]), _tok_span(c[0]))

    def config_ref(self, meta, c):
        return ast.ConfigRef(str(c[0]), ".".join(str(t) for t in c[1:]), _span(meta))

    def call(self, meta, c):
        return ast.Call(str(c[0]), c[1], _span(meta))

    def word(self, meta, c):
        return ast.Word(str(c[0]), _tok_span(c[0]))

    def neg(self, meta, c):
        return ast.Neg(c[0], _span(meta))

    # the binary-operator rules of the grammar, each building a BinOp of its operator
    add, sub, mul, div, floordiv, pow = (_binop(op) for op in ("+", "-", "*", "/", "//", "**"))

    def string(self, meta, c):
        return ast.Lit(_string(c[0]), _tok_span(c[0]))

    def boolean(self, meta, c):
        return ast.Lit(str(c[0]) == "true", _tok_span(c[0]))

    def null(self, meta, c):
        return ast.Lit(None, _span(meta))

    def list(self, meta, c):
        return ast.ListV(tuple(v for v in c if v is not None), _span(meta))

    def key(self, meta, c):
        return str(c[0])

    def role(self, meta, c):
        return str(c[0])

    def entry_kv(self, meta, c):
        return ast.MapEntry(c[0], c[1], _span(meta))

    def map(self, meta, c):
        return ast.MapV(tuple(e for e in c if e is not None), _span(meta))

    def qualname(self, meta, c):
        return (".".join(str(t) for t in c), _span(meta))

    def class_object(self, meta, c):
        return ast.ClassObject(c[0][0], c[0][1], c[1], _span(meta))

    # ---- declarations
    def model_head(self, meta, c):
        return ("head", str(c[0]), str(c[1]), _span(meta))

    def param(self, meta, c):
        return ast.Param(str(c[0]), c[1], _span(meta))

    def profile(self, meta, c):
        return ("profile", tuple(c))

    def runtime(self, meta, c):
        name, dtype, lo, hi, default, doc = c
        return ast.RuntimeDecl(str(name), str(dtype), lo, hi, default,
                               _string(doc) if doc is not None else "", _span(meta))

    def config_inline(self, meta, c):
        return ("config", c[0], _span(meta), False)

    def config_checkpoint(self, meta, c):
        return ("config", c[0], _span(meta), True)

    def setting(self, meta, c):
        return ast.Setting(str(c[0]), str(c[1]), _span(meta))

    def options(self, meta, c):
        return ("options", c[0], _span(meta))

    def tokenizer(self, meta, c):
        return ast.TokenizerDecl(c[0][0], _string(c[1]), c[2], _span(meta))

    def tensor_type(self, meta, c):
        return ast.TensorSpec(str(c[0]), tuple(d for d in c[1:] if d is not None), _span(meta))

    def input_tensor(self, meta, c):
        return ast.InputDecl(str(c[0]), c[1], None, _span(meta))

    def input_runtime(self, meta, c):
        return ast.InputDecl(str(c[0]), None, str(c[1]), _span(meta))

    def output(self, meta, c):
        sel = c[2]
        select = _string(sel) if sel.type == "STRING" else int(sel)
        return ast.OutputDecl(str(c[0]), c[1], select, _span(meta))

    def attn_heads(self, meta, c):
        return ("heads", c[0], _span(meta))

    def attn_head_dim(self, meta, c):
        return ("head_dim", c[0], _span(meta))

    def attn_order(self, meta, c):
        return ("order", tuple(str(t) for t in c), _span(meta))

    def attn_text_mask(self, meta, c):
        return ("text_mask", str(c[0]) == "true", _span(meta))

    def attn_valid(self, meta, c):
        return ("valid", str(c[0]), _span(meta))

    def attention(self, meta, c):
        return ast.AttentionDecl(_string(c[0]), str(c[1]), tuple(c[2:]), _span(meta))

    def component(self, meta, c):
        role, name, (qualname, qspan), subfolder, *items = c
        config = [i for i in items if isinstance(i, tuple) and i[0] == "config"]
        options = [i for i in items if isinstance(i, tuple) and i[0] == "options"]
        pick = lambda cls: tuple(i for i in items if isinstance(i, cls))  # noqa: E731
        toks = pick(ast.TokenizerDecl)
        if not config:
            raise _Located(f"component {name} needs `config {{ ... }}` or `config from checkpoint`",
                           _span(meta))
        if len(config) > 1:
            raise _Located("a component has one config; this is a second", config[1][2])
        if len(options) > 1:
            raise _Located("a component has one options map; this is a second", options[1][2])
        if len(toks) > 1:
            raise _Located("a component has one tokenizer; this is a second", toks[1].span)
        return ast.ComponentDecl(
            role=str(role), name=str(name), qualname=qualname, qualname_span=qspan,
            subfolder=_string(subfolder), config=config[0][1],
            config_from_checkpoint=config[0][3], config_span=config[0][2],
            settings=pick(ast.Setting), options=options[0][1] if options else None,
            tokenizer=toks[0] if toks else None,
            inputs=pick(ast.InputDecl), outputs=pick(ast.OutputDecl),
            attentions=pick(ast.AttentionDecl), span=_span(meta))

    def step(self, meta, c):
        (name, _), *rest = c
        params = rest[-1] if rest and isinstance(rest[-1], ast.MapV) else None
        comps = tuple((str(t), _tok_span(t)) for t in rest if isinstance(t, Token))
        return ast.StepDecl(name, comps, params, _span(meta))

    def schedule(self, meta, c):
        return ("schedule", tuple(c), _span(meta))


class _Located(Exception):
    """A structural mistake found while building the AST; parse_text locates it."""

    def __init__(self, message: str, span: ast.Span) -> None:
        super().__init__(message)
        self.message, self.span = message, span


def _line_of(text: str, line: int) -> str:
    lines = text.splitlines()
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def parse_text(text: str, file: str = "<string>") -> ast.ModelDecl:
    """Parse DSL source; raise DiffletError(file:line:col) on a syntax error."""
    try:
        tree = _parser().parse(text)
    except lark.exceptions.UnexpectedInput as err:
        raise DiffletError(_syntax_message(err), where=Loc(file, err.line, err.column),
                           snippet=_line_of(text, err.line)) from None
    head, *items = tree.children
    try:
        head = _ToAst().transform(head)
        items = [_ToAst().transform(i) for i in items]
    except lark.exceptions.VisitError as err:
        if isinstance(err.orig_exc, _Located):
            sp = err.orig_exc.span
            raise DiffletError(err.orig_exc.message, where=Loc(file, sp.line, sp.col),
                               snippet=_line_of(text, sp.line)) from None
        raise
    profile_items = [i[1] for i in items if isinstance(i, tuple) and i[0] == "profile"]
    params = tuple(p for group in profile_items for p in group)
    schedules = [i for i in items if isinstance(i, tuple) and i[0] == "schedule"]
    steps = tuple(s for sch in schedules for s in sch[1])
    if len(schedules) > 1:
        sp = schedules[1][2]
        raise DiffletError("a model has one schedule; found a second", where=Loc(file, sp.line, sp.col),
                           snippet=_line_of(text, sp.line))
    return ast.ModelDecl(
        name=head[1], family=head[2], params=params,
        runtimes=tuple(i for i in items if isinstance(i, ast.RuntimeDecl)),
        components=tuple(i for i in items if isinstance(i, ast.ComponentDecl)),
        steps=steps, schedule_span=schedules[0][2] if schedules else None, span=head[3])


def _syntax_message(err: lark.exceptions.UnexpectedInput) -> str:
    if isinstance(err, lark.exceptions.UnexpectedCharacters):
        return f"syntax error: unexpected character {err.char!r}"
    if isinstance(err, lark.exceptions.UnexpectedEOF):
        return "syntax error: unexpected end of file"
    tok = err.token
    expected = sorted(_pretty(t) for t in getattr(err, "expected", ()) or ())
    shown = "end of file" if tok.type == "$END" else repr(str(tok))
    hint = f"; expected {', '.join(expected[:8])}" if expected else ""
    return f"syntax error: unexpected {shown}{hint}"


def _pretty(terminal: str) -> str:
    try:
        pattern = _parser().get_terminal(terminal).pattern
    except KeyError:
        return terminal
    if pattern.type == "str":
        return repr(pattern.value)
    return terminal.lower() if terminal in ("NAME", "STRING", "NUMBER", "BOOL") else terminal

