"""The pyparsing grammar diagnose used to read launch dumps with, kept as the reference the
hand-written reader in diagnose/launch.py must agree with (tests only)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import pyparsing as pp

# the same raw-text marker and Some(x) unwrapping as the reader, so results compare equal
from diagnose.launch import _Raw, _unwrap


@lru_cache(maxsize=1)
def _grammar() -> dict[str, pp.ParserElement]:
    pp.ParserElement.enable_packrat()
    value = pp.Forward()
    ident = pp.Word(pp.alphas + "_", pp.alphanums + "_.")
    string = pp.QuotedString("'", esc_char="\\", unquote_results=True) | pp.QuotedString(
        '"', esc_char="\\", unquote_results=True
    )
    number = pp.Regex(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?(?![\w.])")
    number.set_parse_action(lambda t: float(t[0]) if any(c in t[0] for c in ".eE") else int(t[0]))
    const = pp.Regex(r"(?:None|True|False|true|false|null)(?![\w.])")
    # a parse action returning None keeps the tokens, so return a one-item list
    const.set_parse_action(
        lambda t: [
            {"None": None, "null": None, "True": True, "true": True, "False": False, "false": False}[t[0]]
        ]
    )
    lp, rp, lb, rb, lc, rc = map(pp.Suppress, "()[]{}")
    colon, _comma, eq = pp.Suppress(":"), pp.Suppress(","), pp.Suppress("=")

    def seq(open_: pp.ParserElement, close: pp.ParserElement, item: pp.ParserElement) -> pp.ParserElement:
        return open_ + pp.Optional(pp.DelimitedList(item, allow_trailing_delim=True)) + close

    listv = pp.Group(seq(lb, rb, value)).set_parse_action(lambda t: [list(t[0])])
    tuplev = pp.Group(seq(lp, rp, value)).set_parse_action(lambda t: [tuple(t[0])])
    dict_item = pp.Group(value + colon + value)
    dictv = pp.Group(seq(lc, rc, dict_item)).set_parse_action(lambda t: [{_key(k): v for k, v in t[0]}])
    kwarg = pp.Group(ident + eq + value)
    call_arg = kwarg | value
    callv = (ident + pp.Group(seq(lp, rp, call_arg))).set_parse_action(
        lambda t: [
            {
                _key(k): v
                for k, v in (a if isinstance(a, pp.ParseResults) and len(a) == 2 else ("_", a) for a in t[1])
            }
        ]
    )
    # Rust Debug: Args { model_id: "x", num_shard: Some(2), … } ; Some(x) / None
    rust_field = pp.Group(ident + colon + value)
    rust_struct = (ident + pp.Group(seq(lc, rc, rust_field))).set_parse_action(
        lambda t: [{str(k): v for k, v in t[1]}]
    )
    enum_repr = pp.Regex(r"<[^<>]*>").set_parse_action(lambda t: _Raw(t[0]))
    bare = pp.Regex(r"[^,()\[\]{}\s'\"][^,()\[\]{}]*").set_parse_action(lambda t: _Raw(t[0].strip()))
    value <<= string | number | const | rust_struct | callv | dictv | listv | tuplev | enum_repr | bare
    kwargs = pp.DelimitedList(kwarg, allow_trailing_delim=True)
    return {"value": value, "kwargs": kwargs}


def _key(k: Any) -> str:
    return str(k)


def parse_with_grammar(kind: str, text: str) -> dict[str, Any]:
    """The pyparsing path: Rust debug dumps, enum reprs, bare words, truncated lines.
    `text` comes stripped (parse_repr)."""
    g = _grammar()
    try:
        if kind == "python_kwargs":
            # the text runs to the end of the line; take as many k=v pairs as parse
            res = g["kwargs"].parse_string(text, parse_all=False)
            return {str(k): _unwrap(v) for k, v in res}
        res = g["value"].parse_string(text, parse_all=False)
    except pp.ParseBaseException:
        return {}
    v = res[0] if res else None
    if isinstance(v, dict):
        return {str(k): _unwrap(x) for k, x in v.items() if k != "_"}
    return {}
