"""Launch parameters from the argument dumps engines print, read by a small backtracking reader.

vLLM prints `args: Namespace(…)` (V0) or `non-default args: {…}` (V1) and a
`with config: model=…, tensor_parallel_size=…` line; SGLang `server_args=ServerArgs(…)`
or a dict; TGI a Rust `Args { … }` debug dump. These are reprs with nested quotes, lists,
dicts, calls and None/True: a backtracking reader handles them where string splitting cannot.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ..model.canonical_params import SETTINGS

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

# Launch keys every engine may print under the canonical (vLLM) name: the settings advice
# may change, and what the report shows besides.
CANONICAL = SETTINGS | {
    "model",
    "host",
    "block_size",
    "served_model_name",
    "distributed_executor_backend",
    "max_cudagraph_capture_size",
    "max_seq_len_to_capture",
}


class _Raw(str):
    """A value kept as text (an expression the reader does not model)."""


class _NoMatch(Exception):
    """This alternative does not match here: try the next one (the reader backtracks)."""


# The tokens of the dump language, as regexes anchored where the reader stands.
_WS = re.compile(r"[ \t\r\n]*")
_STRING = {q: re.compile(rf"{q}((?:\\.|[^{q}\n\r\\])*){q}") for q in ("'", '"')}
_NUMBER = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?(?![\w.])")
_CONST = re.compile(r"(?:None|True|False|true|false|null)(?![\w.])")
_CONSTS = {"None": None, "null": None, "True": True, "true": True, "False": False, "false": False}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
_ENUM = re.compile(r"<[^<>]*>")
_BARE = re.compile(r"[^,()\[\]{}\s'\"][^,()\[\]{}]*")
_ESCAPE = re.compile(r"\\([0-7]{3}|0|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[tnfr]|.)", re.DOTALL)
_WS_ESCAPES = {"t": "\t", "n": "\n", "f": "\f", "r": "\r"}
_MAX_DEPTH = 200


def _unescape(m: re.Match[str]) -> str:
    g = m.group(1)
    if g in _WS_ESCAPES:
        return _WS_ESCAPES[g]
    if g == "0":
        return "\0"
    if len(g) == 3 and g.isdigit():
        return chr(int(g, 8))
    if g[0] in "xuU" and len(g) > 1:
        n = int(g[1:], 16)
        return chr(n) if n <= 0x10FFFF else m.group(0)
    return g


class _Reader:
    """A backtracking reader of one dump: string | number | const | Rust struct | call | dict |
    list | tuple | <enum repr> | bare word, tried in that order (the first that matches wins).
    Written by hand rather than with pyparsing: importing pyparsing and building a grammar cost
    ~50 ms of a cold start, far more than reading the dump."""

    def __init__(self, text: str):
        self.s = text
        self.i = 0
        self.depth = 0

    def _skip(self) -> None:
        self.i = _WS.match(self.s, self.i).end()  # type: ignore[union-attr]

    def _take(self, rx: re.Pattern[str]) -> re.Match[str]:
        self._skip()
        m = rx.match(self.s, self.i)
        if m is None:
            raise _NoMatch
        self.i = m.end()
        return m

    def _char(self, c: str) -> None:
        self._skip()
        if not self.s.startswith(c, self.i):
            raise _NoMatch
        self.i += 1

    def _seq(self, open_: str, close: str, item: Any) -> list[Any]:
        """open item (, item)* [,] close — the items may be absent."""
        self._char(open_)
        out: list[Any] = []
        start = self.i
        try:
            out.append(item())
        except _NoMatch:
            self.i = start
        else:
            while True:
                try:
                    self._char(",")
                except _NoMatch:
                    break
                after_comma = self.i
                try:
                    out.append(item())
                except _NoMatch:
                    self.i = after_comma  # a trailing comma
                    break
        self._char(close)
        return out

    def value(self) -> Any:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _NoMatch
        try:
            self._skip()
            start = self.i
            for alt in self._ALTERNATIVES:
                try:
                    return alt(self)
                except _NoMatch:
                    self.i = start
            raise _NoMatch
        finally:
            self.depth -= 1

    def _string(self) -> str:
        self._skip()
        rx = _STRING.get(self.s[self.i : self.i + 1])
        if rx is None:
            raise _NoMatch
        body = self._take(rx).group(1)
        return _ESCAPE.sub(_unescape, body) if "\\" in body else body

    def _number(self) -> int | float:
        t = self._take(_NUMBER).group(0)
        return float(t) if any(c in t for c in ".eE") else int(t)

    def _const(self) -> Any:
        return _CONSTS[self._take(_CONST).group(0)]

    def _rust_struct(self) -> dict[str, Any]:
        self._take(_IDENT)

        def field() -> tuple[str, Any]:
            k = self._take(_IDENT).group(0)
            self._char(":")
            return k, self.value()

        return dict(self._seq("{", "}", field))

    def _kwarg(self) -> tuple[str, Any]:
        k = self._take(_IDENT).group(0)
        self._char("=")
        return k, self.value()

    def _call(self) -> dict[str, Any]:
        self._take(_IDENT)

        def arg() -> tuple[str, Any]:
            start = self.i
            try:
                return self._kwarg()
            except _NoMatch:
                self.i = start
                return "_", self.value()  # a positional argument (Rust's Some(x))

        return dict(self._seq("(", ")", arg))

    def _dict(self) -> dict[str, Any]:
        def item() -> tuple[str, Any]:
            k = self.value()
            self._char(":")
            return str(k), self.value()

        return dict(self._seq("{", "}", item))

    def _list(self) -> list[Any]:
        return self._seq("[", "]", self.value)

    def _tuple(self) -> tuple[Any, ...]:
        return tuple(self._seq("(", ")", self.value))

    def _enum(self) -> str:
        return _Raw(self._take(_ENUM).group(0))

    def _bare(self) -> str:
        return _Raw(self._take(_BARE).group(0).strip())

    _ALTERNATIVES = (_string, _number, _const, _rust_struct, _call, _dict, _list, _tuple, _enum, _bare)

    def opened_pairs(self, kind: str) -> list[tuple[str, Any]]:
        """The complete pairs of a dump cut short before its closing bracket (a pasted excerpt
        ending in "…"): each one read up to the comma after it, so a value the cut may have
        shortened (the last one) is left out."""
        if kind == "python_dict":
            self._char("{")

            def pair() -> tuple[str, Any]:
                k = self.value()
                self._char(":")
                return str(k), self.value()

        else:
            self._take(_IDENT)
            self._char("(" if kind == "python_call" else "{")

            def pair() -> tuple[str, Any]:
                k = self._take(_IDENT).group(0)
                self._char("=" if kind == "python_call" else ":")
                return k, self.value()

        out: list[tuple[str, Any]] = []
        while True:
            try:
                p = pair()
                self._char(",")
            except _NoMatch:
                return out
            out.append(p)

    def kwargs(self) -> list[tuple[str, Any]]:
        """kwarg (, kwarg)* [,] — as many as read; the rest of the line is ignored."""
        out = [self._kwarg()]
        while True:
            back = self.i
            try:
                self._char(",")
                out.append(self._kwarg())
            except _NoMatch:
                self.i = back
                break
        return out


def _unwrap(v: Any) -> Any:
    # Rust Some(x) reads as a call {"_": x}
    if isinstance(v, dict) and set(v) == {"_"}:
        return _unwrap(v["_"])
    if isinstance(v, _Raw):
        return str(v)
    return v


def parse_repr(kind: str, text: str) -> dict[str, Any]:
    """Parse one dump into a flat mapping of top-level keys. Unparseable text gives {}."""
    return dict(_parsed(kind, text.strip()))


@lru_cache(maxsize=64)
def _parsed(kind: str, text: str) -> dict[str, Any]:
    # the replicas of a deployment print the same dump: a process reading a fleet's logs
    # parses each distinct one once (a vLLM config line is a millisecond of parsing)
    if kind == "command_line":
        return _parse_command_line(text)
    return read_dump(kind, text)


def read_dump(kind: str, text: str) -> dict[str, Any]:
    """Read a Python repr, dict, keyword list or Rust debug dump (enum reprs, bare words and
    truncated lines included). `text` comes stripped (parse_repr)."""
    reader = _Reader(text.expandtabs())  # as pyparsing did: tabs read as spaces
    try:
        if kind == "python_kwargs":
            # the text runs to the end of the line; take as many k=v pairs as read
            return {k: _unwrap(v) for k, v in reader.kwargs()}
        v = reader.value()
    except (_NoMatch, RecursionError):
        v = None
    if not isinstance(v, dict):
        try:  # cut short before its closing bracket: the pairs that are whole
            v = dict(_Reader(text.expandtabs()).opened_pairs(kind))
        except (_NoMatch, RecursionError):
            return {}
    return {str(k): _unwrap(x) for k, x in v.items() if k != "_"}


def _parse_command_line(text: str) -> dict[str, Any]:
    try:
        import shlex  # command lines only

        words = shlex.split(text)
    except ValueError:
        words = text.split()
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("-") and len(w) > 1 and not _is_number(w):
            key = w.lstrip("-")  # --max-model-len, -tp, -c, -ngl
            nxt = words[i + 1] if i + 1 < len(words) else None
            if "=" in key:
                key, val = key.split("=", 1)
                out[key.replace("-", "_")] = _scalar(val)
            elif nxt is not None and (not nxt.startswith("-") or _is_number(nxt)):
                out[key.replace("-", "_")] = _scalar(nxt)
                i += 1
            else:
                out[key.replace("-", "_")] = True
        elif (
            i > 0
            and words[i - 1].rsplit("/", 1)[-1] in ("serve", "api_server", "trtllm-serve")
            and "model" not in out
            and w not in ("api_server", "gradio", "proxy")
        ):
            out["model"] = w  # vllm serve M, lmdeploy serve api_server M, trtllm-serve M
        i += 1
    return out


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _scalar(s: str) -> Any:
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return s


def canonical_launch(raw: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """Keep the parameters the advice and report use, under their canonical names."""
    out: dict[str, Any] = {}
    for k, v in raw.items():
        key = names.get(k, k)
        if key not in CANONICAL and key not in names.values():
            continue
        if v is None:
            continue
        if isinstance(v, (dict, list, tuple)) and key not in ("limit_mm_per_prompt", "served_model_name"):
            continue
        if isinstance(v, tuple):
            v = list(v)
        out[key] = v
    return out
