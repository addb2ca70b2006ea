"""A template's pieces → the regular expression that finds it in a log line.

Only one line of a message reaches a log line (the exception line, or the first line of a
logged message), so the pattern covers the first line of the template with enough literal
text to be told apart; placeholders become typed captures named after what fills them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Protocol

MIN_LITERAL = 8  # a template whose longest literal run is shorter cannot be told from others
_NAME = re.compile(r"[^0-9A-Za-z_]")
_KIND_RE = {
    "int": r"-?\d[\d,]*",
    "float": r"-?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|-?inf",
    "text": r".*?",
}


class PieceLike(Protocol):
    text: str
    kind: str | None
    name: str


def _lines(pieces: Sequence[PieceLike]) -> list[list[tuple[str | None, str]]]:
    """The template cut at its newlines: lists of (kind or None, text-or-name)."""
    out: list[list[tuple[str | None, str]]] = [[]]
    for p in pieces:
        if p.kind is not None:
            out[-1].append((p.kind, p.name))
            continue
        parts = p.text.split("\n")
        for i, part in enumerate(parts):
            if i:
                out.append([])
            if part:
                out[-1].append((None, part))
    return out


def _literal_len(line: list[tuple[str | None, str]]) -> int:
    """The longest literal run, counted only when it says something: two words or more
    ("Exception: {e}" or "Error: {}" wrap any message and tell nothing)."""
    best = 0
    for k, t in line:
        if k is None and len(re.findall(r"[A-Za-z]{2,}", t)) >= 2:
            best = max(best, len(t.strip()))
    return best


def build(pieces: Sequence[PieceLike]) -> tuple[str, str] | None:
    """(pattern, longest literal) of the template's first telling line, or None."""
    for line in _lines(pieces):
        if _literal_len(line) >= MIN_LITERAL:
            break
    else:
        return None
    # placeholders at either end find nothing a search does not already skip
    while line and line[0][0] == "text":
        line = line[1:]
    while line and line[-1][0] == "text":
        line = line[:-1]
    if line and line[0][0] is None:
        line[0] = (None, line[0][1].lstrip())
    if line and line[-1][0] is None:
        line[-1] = (None, line[-1][1].rstrip())
    out: list[str] = []
    used: set[str] = set()
    longest = ""
    for kind, text in line:
        if kind is None:
            if len(text.strip()) > len(longest):
                longest = text.strip()
            out.append(r"\s+".join(re.escape(w) for w in re.split(r"\s+", text)) if text.strip() else r"\s*")
            continue
        name = _NAME.sub("_", text).strip("_")[:40]
        body = _KIND_RE[kind]
        if name and not name[0].isdigit() and name not in used:
            used.add(name)
            out.append(f"(?P<{name}>{body})")
        else:
            out.append(f"(?:{body})")
    pattern = "".join(out)
    try:
        re.compile(pattern)
    except re.error:
        return None
    return pattern, longest


def template_text(pieces: Sequence[PieceLike]) -> str:
    """The template as the mined file shows it: literal text, each placeholder as {name}."""
    return "".join(p.text if p.kind is None else "{" + (p.name or "") + "}" for p in pieces)


def template_id(engine: str, text: str) -> str:
    """Stable across versions: the engine and the template's own text."""
    return f"{engine}.m.{hashlib.sha1(text.encode()).hexdigest()[:10]}"
