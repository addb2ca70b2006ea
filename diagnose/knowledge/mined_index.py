"""The literal index beside each mined file (`<source>.index.json`): what it holds, read from
the file itself, and how it is written (by the miner, `python -m tools.mine.store`) and read.

A scan reads only this index and the records its literals hit (mined.Bundle): reading a whole
8 MB file into template objects cost ~0.15 s and 10 MB a file; the index costs a few ms.
"""

from __future__ import annotations

import json
import re
import sys
from array import array

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_TEMPLATES_START = b'\n  "templates": [\n'
_FRAMES_START = b'\n  ],\n  "frames": {'
_ROOTS_START = b'\n  },\n  "roots": {'
_LITERAL_KEY = b'"literal": "'
_LEVEL_KEY = b'", "level": "'


INDEX_SCHEMA = 3
WORD = re.compile(r"\w+")
NON_WORD = re.compile(r"\W+")
# Between the literals of an index, which holds them as one string and their templates' line
# offsets as packed 32-bit arrays: a dict of 15 k literals, each with a list of int objects,
# cost ~6 MB a large engine once parsed; the packed form ~2 MB.
SEP = "\x00"


def index_path_of(path: str) -> str:
    return path[: -len(".json")] + ".index.json"


def pack(values: list[int]) -> str:
    import base64

    a = array("I", values)
    if sys.byteorder == "big":
        a.byteswap()
    return base64.b64encode(a.tobytes()).decode("ascii")


def unpack(text: str) -> array[int]:
    import base64

    a = array("I")
    a.frombytes(base64.b64decode(text))
    if sys.byteorder == "big":
        a.byteswap()
    return a


def scan_store(path: str) -> dict[str, Any]:
    """What a mined file's index holds, read from the file itself: its head, frames, roots and,
    for each longest literal, where its templates' lines start (tools/mine/store.py writes one
    template a line, "literal" right before "level")."""
    with open(path, "rb") as f:
        raw = f.read()
    a, b, c = raw.find(_TEMPLATES_START), raw.find(_FRAMES_START), raw.find(_ROOTS_START)
    if not 0 < a < b < c:
        raise ValueError("not laid out one template a line (rebuild it with python -m tools.mine)")
    head = json.loads(raw[:a].rstrip().rstrip(b",") + b"\n}")
    tail = raw[c + len(_ROOTS_START) :]
    offsets: dict[str, list[int]] = {}
    # bytes.find hops from one literal to the next (a regex over the file took 4× longer)
    find, key = raw.find, _LITERAL_KEY
    pos = find(key, a, b)
    while pos >= 0:
        start = pos + len(key)
        end = find(_LEVEL_KEY, start, b)
        if end < 0:
            break
        if find(b"\n", start, end) >= 0:  # the key's words inside a message's text
            pos = find(key, start, b)
            continue
        lit = raw[start:end]
        text = lit.decode() if b"\\" not in lit else json.loads(b'"' + lit + b'"')
        offsets.setdefault(text, []).append(raw.rfind(b"\n", a, pos) + 1)
        pos = find(key, end, b)
    roots_at = c + len(_ROOTS_START)
    literals = sorted(offsets)
    if any(SEP in lit for lit in literals):
        raise ValueError("a literal holds a NUL character")
    starts = [0]
    for lit in literals:
        starts.append(starts[-1] + len(offsets[lit]))
    return {
        "schema": INDEX_SCHEMA,
        "size": len(raw),
        "engine": head["engine"],
        "source": head["source"],
        "versions": head.get("versions") or [],
        # where the frames and the roots lie in the file: read only when a stack is asked about
        "frames_span": [b + len(_FRAMES_START), c],
        "roots_span": [roots_at, roots_at + tail.rfind(b"\n  }")],
        # literal i's templates start at offsets[starts[i]:starts[i + 1]] (literals sorted)
        "literals": SEP.join(literals),
        "starts": pack(starts),
        "offsets": pack([o for lit in literals for o in offsets[lit]]),
        # each literal's longest inner word (words[word_of[i]]; NO_WORD: none): the word index a
        # long scan asks from, built here once instead of in every process that needs it
        **word_fields(literals),
    }


NO_WORD = 0xFFFFFFFF


def inner_word(literal: str) -> str:
    """The literal's longest whole inner word (a word with a non-word character on both sides
    inside the literal: wherever the literal is in a line, that word is a word of the line)."""
    return max(NON_WORD.split(literal)[1:-1], key=len, default="")  # the first and last runs may be cut


def word_fields(literals: list[str]) -> dict[str, str]:
    best = [inner_word(lit) for lit in literals]
    words = sorted({w for w in best if w})
    number = {w: i for i, w in enumerate(words)}
    return {"words": SEP.join(words), "word_of": pack([number[w] if w else NO_WORD for w in best])}


def write_index(path: str) -> None:
    """<source>.index.json beside a mined file (the miner calls this after writing it)."""
    from ..base.atomic import atomic_write

    idx = scan_store(path)
    # ASCII throughout: one non-ASCII character would make the parsed document, and the literals'
    # string, two or four bytes a character (a peak of 11 MB for vLLM's index, 6 MB without)
    fields = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in idx.items()]
    atomic_write(index_path_of(path), ("{\n" + ",\n".join(fields) + "\n}\n").encode())


def word_index(words: list[str], word_of: array[int]) -> tuple[dict[str, list[int]], list[int]]:
    """Each literal under its longest inner word (the index's `words`/`word_of`), in file
    order; the literals with no such word, to try on every line."""
    by_word: dict[str, list[int]] = {}
    always: list[int] = []
    for i, w in enumerate(word_of):
        if w == NO_WORD:
            always.append(i)
        else:
            by_word.setdefault(words[w], []).append(i)
    return by_word, always
