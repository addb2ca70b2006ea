"""Message templates from the C/C++ (llama.cpp, ggml), Go (Ollama) and Rust (TGI's router
and launcher) sources, by their printing statements' shapes: the engines print through a
handful of macros and functions whose first string argument is the format."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .python_source import Piece

_STR = r'"(?:[^"\\\n]|\\.)*"'
# the literal arguments of one call: adjacent string literals and format macros between them
_C_ARGS = rf"((?:\s*(?:{_STR}|PRI[diux]\d+|PRI[diux]MAX|GGML_PRI\w*|__func__)\s*)+)"
_C_CALLS = [
    (r"(?:LLAMA_LOG_ERROR|GGML_LOG_ERROR|LOG_ERR|SRV_ERR|SLT_ERR|QUE_ERR|LOG_ERROR)", "error"),
    (r"(?:LLAMA_LOG_WARN|GGML_LOG_WARN|LOG_WRN|SRV_WRN|SLT_WRN|LOG_WARNING)", "warning"),
    (r"(?:GGML_ABORT|GGML_ASSERT_MSG)", "critical"),
    (
        r"throw\s+std::(?:runtime_error|invalid_argument|out_of_range|length_error)\s*\(\s*(?:format\s*\()?",
        "raise",
    ),
    (r"fprintf\s*\(\s*stderr\s*,", "error"),
]
_C_RE = [
    (
        re.compile(
            rf"\b{call}(?:\s*\(\s*(?:\w+\s*,\s*)?)?{_C_ARGS}"
            if not call.startswith(("throw", "fprintf"))
            else rf"{call}{_C_ARGS}"
        ),
        level,
    )
    for call, level in _C_CALLS
]
_GO_STR = r'(?:"(?:[^"\\\n]|\\.)*"|`[^`]*`)'
_RS_STR = r'"(?:[^"\\]|\\.)*"'
# (the call up to its format string, level); the format string is the group after it
_GO_CALLS = [
    (r"\bslog\.Error(?:Context)?\(\s*(?:ctx,\s*)?", "error"),
    (r"\bslog\.Warn(?:Context)?\(\s*(?:ctx,\s*)?", "warning"),
    (r"\bfmt\.Errorf\(\s*", "raise"),
    (r"\berrors\.New\(\s*", "raise"),
    (r"\blog\.(?:Fatal|Fatalf|Panicf?)\(\s*", "critical"),
    (r"\bpanic\(\s*(?:fmt\.Sprintf\(\s*)?", "critical"),
]
_RS_CALLS = [
    (r"\b(?:tracing::)?error!\(\s*(?:[\w.]+\s*=\s*[^,]+,\s*)*", "error"),
    (r"\b(?:tracing::)?warn!\(\s*(?:[\w.]+\s*=\s*[^,]+,\s*)*", "warning"),
    (r"#\[error\(\s*", "raise"),
    (r"\bpanic!\(\s*", "critical"),
    (r"\.expect\(\s*", "critical"),
    (r"\bbail!\(\s*", "raise"),
    (r"\banyhow!\(\s*", "raise"),
]
_GO_RE = [(re.compile(f"{call}({_GO_STR})"), level) for call, level in _GO_CALLS]
_RS_RE = [(re.compile(f"{call}({_RS_STR})"), level) for call, level in _RS_CALLS]
_C_FMT = re.compile(
    r"%(?:\d+\$)?[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z|j|t)?([diouxXeEfFgGcspa%])|\x00(\w)"
)
_GO_FMT = re.compile(r"%[-+ #0]*(?:\d+|\*)?(?:\.\d+)?([vTtbcdoOqxXUeEfFgGsw%p])")
_RS_FMT = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
_ESC = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'", "r": ""}


@dataclass
class NativeTemplate:
    pieces: list[Piece]
    level: str
    exc: str
    module: str
    function: str
    line: int


def _unescape(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESC.get(m.group(1), m.group(1)), s)


def _c_format(args: str) -> str:
    """Adjacent C string literals joined; a PRId64-style macro or __func__ stands for a hole."""
    out = []
    for tok in re.finditer(rf"{_STR}|(PRI[diux]\w*|GGML_PRI\w*)|(__func__)", args):
        if tok.group(1):
            if out:  # "%" PRIu64: the conversion's flags end the literal before the macro
                out[-1] = re.sub(r"%[-+ #0-9.]*\Z", "", out[-1])
            out.append("\x00d")
        elif tok.group(2):
            continue
        else:
            out.append(_unescape(tok.group(0)[1:-1]))
    return "".join(out)


def _pieces(fmt: str, rx: re.Pattern[str], kind_of: dict[str, str]) -> list[Piece]:
    out: list[Piece] = []
    pos = 0
    for m in rx.finditer(fmt):
        if m.start() > pos:
            out.append(Piece(text=fmt[pos : m.start()]))
        pos = m.end()
        conv = next((g for g in m.groups() if g is not None), None)
        if m.group(0) in ("%%", "{{", "}}"):
            out.append(Piece(text=m.group(0)[0]))
        elif rx is _RS_FMT:
            field_, _, spec = (conv or "").partition(":")
            name = field_ if field_ and not field_.isdigit() else ""
            out.append(Piece(kind="float" if spec.strip().endswith(("f", "e")) else "text", name=name))
        else:
            out.append(Piece(kind=kind_of.get(conv or "", "text")))
    if pos < len(fmt):
        out.append(Piece(text=fmt[pos:]))
    return out


_C_KINDS = dict.fromkeys("diouxX", "int") | dict.fromkeys("eEfFgGa", "float")
_GO_KINDS = dict.fromkeys("dbcoOxX", "int") | dict.fromkeys("eEfFgG", "float")


def mine_native(source: str, module: str) -> list[NativeTemplate]:
    """Templates of one C/C++, Go or Rust file (by its extension)."""
    out: list[NativeTemplate] = []
    if module.endswith((".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".m", ".mm")):
        for rx, level in _C_RE:
            for m in rx.finditer(source):
                fmt = _c_format(m.group(1))
                line = source.count("\n", 0, m.start()) + 1
                exc = "std::runtime_error" if level == "raise" else ""
                out.append(NativeTemplate(_pieces(fmt, _C_FMT, _C_KINDS), level, exc, module, "", line))
    elif module.endswith(".go"):
        for rx, level in _GO_RE:
            for m in rx.finditer(source):
                lit = m.group(1)
                fmt = lit[1:-1] if lit.startswith("`") else _unescape(lit[1:-1])
                line = source.count("\n", 0, m.start()) + 1
                out.append(
                    NativeTemplate(
                        _pieces(fmt, _GO_FMT, _GO_KINDS),
                        level,
                        "error" if level == "raise" else "",
                        module,
                        "",
                        line,
                    )
                )
    elif module.endswith(".rs"):
        for rx, level in _RS_RE:
            for m in rx.finditer(source):
                fmt = _unescape(m.group(1)[1:-1])
                line = source.count("\n", 0, m.start()) + 1
                out.append(NativeTemplate(_pieces(fmt, _RS_FMT, {}), level, "", module, "", line))
    return out
