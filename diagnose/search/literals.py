"""What every match of a pattern must contain: the literal prefilter of ripgrep and Hyperscan.

A rule woken by a needle is searched on its whole line, and `re` tries every alternative of
the pattern at every position: a class's vocabulary (25 alternatives, case-insensitive) costs
~0.2 ms on a 300-character loader line. Most lines hold none of the literals a match needs,
so the search is skipped; on the rest only the top-level alternatives whose literal is on the
line are searched, and the whole pattern is matched once where the earliest of them starts
(the same match `search` gives: an alternation takes, at the leftmost position where any
alternative matches, the first that does, and an alternative whose literal is absent
matches nowhere).

The literals are read from the pattern's parse tree (`re._parser`, which `re.compile` runs
anyway): runs of literal characters in the sequence a match must pass through, descending
into groups, repeats of at least one, and alternations whose every branch has a literal.
Where a literal cannot be proved (a branch like `\\w+ error`), nothing is skipped.
"""

from __future__ import annotations

import itertools
import re
from re import _constants as C  # type: ignore[attr-defined]

from ..base.bounded import kept
from .pattern_tree import REPEATS, ZERO_DIGITS, changes_case, edge_chars, parse_tree, width

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MIN_LITERAL = 3  # a shorter literal is on too many lines to be worth the test
MAX_SETS = 3  # sets of literals kept per alternative (each must be present)
_GLOBAL_FLAGS = re.compile(r"\(\?[aiLmsux]+\)")
# constructs that tie one alternative to another's groups: the alternatives are not split
_CROSS_REFS = re.compile(r"\\[1-9]|\(\?P=|\(\?\(")


def required(pattern: str) -> tuple[list[frozenset[str]], bool] | None:
    """Sets of literals, each set with one literal in the text wherever the pattern matches
    (the most selective first), and whether to compare case-folded; None where no literal of
    MIN_LITERAL characters is proved."""
    tree = parse_tree(pattern)
    if tree is None:
        return None
    fold = bool(tree.state.flags & re.IGNORECASE) or changes_case(tree.data)
    sets = _need(tree.data)
    if not sets:
        return None
    return ([frozenset(x.lower() for x in s) for s in sets] if fold else sets), fold


def _selective(s: frozenset[str]) -> tuple[int, int]:
    return min(map(len, s)), -len(s)  # the longest shortest literal, then the fewest


def _need(seq: Any) -> list[frozenset[str]]:
    """Every set of literals a match of this sequence must hold one of, the best MAX_SETS."""
    sets: list[frozenset[str]] = []
    run: list[str] = []

    def flush() -> None:
        if len(run) >= MIN_LITERAL:
            sets.append(frozenset(["".join(run)]))
        run.clear()

    for op, av in seq:
        if op is C.LITERAL:
            run.append(chr(av))
            continue
        flush()
        sets.extend(_need_of(op, av))
    flush()
    return sorted(set(sets), key=_selective, reverse=True)[:MAX_SETS]


def _need_of(op: Any, av: Any) -> list[frozenset[str]]:
    if op is C.SUBPATTERN:
        return _need(av[3].data)
    if op is C.ATOMIC_GROUP:
        return _need(av.data)
    if op in REPEATS:
        return _need(av[2].data) if av[0] >= 1 else []
    if op is C.BRANCH:  # one literal of some branch: each branch's best set, joined
        best = [_need(b.data)[:1] for b in av[1]]
        if not all(best):
            return []
        return [frozenset().union(*(b[0] for b in best))]
    return []


def top_alternatives(pattern: str) -> list[str] | None:
    """The pattern's top-level alternatives, each with the pattern's global flags; None where it
    has one, or where splitting could change what a group refers to."""
    flags = ""
    m = _GLOBAL_FLAGS.match(pattern)
    if m:
        flags, pattern = m.group(0), pattern[m.end() :]
        if "x" in flags:  # verbose: a `|` may be in a comment
            return None
    if _CROSS_REFS.search(pattern):
        return None
    parts: list[str] = []
    depth, start, i, n = 0, 0, 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i = _class_end(pattern, i)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    return [flags + p for p in parts] if len(parts) > 1 else None


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class opening at i (`[]…]` and `[^]…]` hold a `]`)."""
    i += 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


class Prefilter:
    """Which of a pattern's alternatives can match a text, by their literals: one Aho-Corasick
    pass over the text finds every literal of every alternative."""

    __slots__ = (
        "_always",
        "_by_literal",
        "_digitless",
        "_edges",
        "_finder",
        "_possible",
        "_uid",
        "_widths",
        "alternatives",
        "ascii",
        "fold",
        "literals",
        "split",
        "useful",
    )

    def __init__(self, pattern: str):
        alts = top_alternatives(pattern)
        self.split = alts is not None
        found = [(a, required(a)) for a in alts] if alts is not None else [(pattern, required(pattern))]
        # an alternative with no literal proved is searched on every text (the others still
        # rule themselves out); with none proved at all there is nothing to gain
        self.useful = any(need is not None for _, need in found)
        self.fold = any(need[1] for _, need in found if need is not None)
        index: dict[str, int] = {}
        # per alternative: its text and its sets of literal indexes (each set must be present)
        self.alternatives: list[tuple[str, list[frozenset[int]]]] = []
        for text, need in found:
            sets = need[0] if need is not None else []
            ids = [
                frozenset(index.setdefault(x.lower() if self.fold else x, len(index)) for x in s)
                for s in sets
            ]
            self.alternatives.append((text, ids))
        self.literals = list(index)
        self.ascii = all(x.isascii() for x in self.literals)
        self._finder: Any = None
        self._possible: dict[frozenset[int], list[int]] = {}  # literals present -> possible()
        self._digitless = not any(c.isdigit() for x in self.literals for c in x)
        self._uid = next(_UIDS)  # its key in _SHAPES (an id() could be reused by a later one)
        self._always = [i for i, (_, sets) in enumerate(self.alternatives) if not sets]
        self._widths: dict[int, int | None] = {}  # alternative -> its widest match (None: unbounded)
        self._edges: dict[int, Any] = {}  # alternative -> characters no match of it holds (edges())
        # literal -> the alternatives whose first (most selective) set holds it
        self._by_literal: list[list[int]] = [[] for _ in self.literals]
        for i, (_, sets) in enumerate(self.alternatives):
            for x in sets[0] if sets else ():
                self._by_literal[x].append(i)

    def haystack(self, text: str) -> str | None:
        """The text the literals are looked for in (lowered where they are case-folded); None
        where the test cannot be exact (a non-ASCII literal folded in a non-ASCII text)."""
        if not self.fold:
            return text
        if not (self.ascii or text.isascii()):
            return None
        return _fold(text)

    def possible(self, hay: str) -> list[int]:
        """Indexes of the alternatives whose literals are all in the text."""
        return self.possible_in(_encoded(hay))

    def possible_in(self, data: bytes) -> list[int]:
        """The same, for the haystack as UTF-8 bytes (an ASCII line's own bytes, lowered where
        the literals are folded: what haystack() gives, encoded)."""
        shape = None
        if self._digitless and len(data) <= SHAPE_MAX:
            # a line's literals are those of the line with its digits zeroed (no literal holds a
            # digit): a progress bar's thousand lines, or a request log's, are one shape
            shape = (self._uid, data.translate(ZERO_DIGITS))
            got = _SHAPES.get(shape)
            if got is not None:
                return got
        if self._finder is None:
            self._finder = _finder(self.literals)
        present = self._finder(data)
        got = self._always if not present else self._possible_for(present)
        return got if shape is None else kept(_SHAPES, shape, got, SHAPES_KEPT)

    def _possible_for(self, present: frozenset[int]) -> list[int]:
        # lines hold the same few combinations of literals again and again: each worked out once
        got = self._possible.get(present)
        if got is None:
            got = kept(self._possible, present, self._possible_with(present), POSSIBLE_KEPT)
        return got

    def _possible_with(self, present: frozenset[int]) -> list[int]:
        woken: set[int] = set()
        for x in present:
            woken.update(self._by_literal[x])
        alts = self.alternatives
        ok = [i for i in woken if all(not s.isdisjoint(present) for s in alts[i][1][1:])]
        return sorted([*ok, *self._always]) if self._always else sorted(ok)

    def width(self, i: int) -> int | None:
        """The most characters a match of alternative i spans, and None where that is unbounded
        or a lookaround reads past the match (then no window around a literal holds it)."""
        if i not in self._widths:
            self._widths[i] = width(self.alternatives[i][0], WINDOW_WIDEST)
        return self._widths[i]

    def edges(self, i: int) -> Any:
        """A pattern for the ASCII characters no match of alternative i can hold (None where
        every one may, or the alternative reads past its match): an unbounded alternative built
        of character classes (`\\w* tokenizer`) still stays inside the run of other characters
        around its literal."""
        if i not in self._edges:
            self._edges[i] = edge_chars(self.alternatives[i][0])
        return self._edges[i]

    def windows(self, i: int, hay: str, text: str) -> list[tuple[int, int]] | None:
        """Stretches of the text that hold every match of alternative i: around each occurrence
        of its first set's literals, as wide as a match can be, or where that is unbounded, the
        run around it of characters a match can hold (and WINDOW_PAD more on each side for a
        word boundary); None where no such stretch can be told (no literal, no edge)."""
        width = self.width(i)
        sets = self.alternatives[i][1]
        if not sets:
            return None
        edges: Any = None
        rev = ""  # the text reversed, where edges are read
        if width is None:
            edges = self.edges(i)
            if edges is None:
                return None
            rev = _reversed(text)
        spans: list[tuple[int, int]] = []
        n = len(hay)  # the text's length too: folding keeps every character one character
        for x in sets[0]:
            lit = self.literals[x]
            at = hay.find(lit)
            while at >= 0:
                if width is not None:
                    spans.append(
                        (max(0, at - width - WINDOW_PAD), min(n, at + len(lit) + width + WINDOW_PAD))
                    )
                else:
                    # the edges are read on the text itself (ASCII characters, tested with `re`)
                    right = edges.search(text, at + len(lit))
                    left = edges.search(rev, n - at)
                    lo = 0 if left is None else n - left.start()
                    hi = n if right is None else right.start()
                    spans.append((max(0, lo - WINDOW_PAD), min(n, hi + WINDOW_PAD)))
                at = hay.find(lit, at + 1)
        spans.sort()
        merged: list[tuple[int, int]] = []
        for lo, hi in spans:
            if merged and lo <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        return merged


def _finder(literals: list[str]) -> Any:
    """UTF-8 bytes -> the frozen set of indexes of the literals in them (overlapping ones
    included): the scan's own multi-literal index, on bytes (the str automaton converts every
    offset to a character index, 2× slower); on a text of LONG_TEXT bytes or more, Hyperscan's presence
    test where it runs (Aho-Corasick reports every match: hundreds on a request dump)."""
    from .needles import make_index, make_presence

    encoded = [x.encode() for x in literals]
    present = make_index(encoded).present
    presence: list[Any] = []  # built on the first long text

    def find(data: bytes) -> frozenset[int]:
        if len(data) >= LONG_TEXT:
            if not presence:
                presence.append(make_presence(encoded))
            if presence[0] is not None:
                return presence[0].present(data)  # type: ignore[no-any-return]
        return present(data)  # type: ignore[no-any-return]

    return find


LONG_TEXT = 16 << 10  # bytes from which a text's literals are found by Hyperscan where it runs


# The non-ASCII letters `re` matches to an ASCII letter case-insensitively (re/_casefix.py's
# extra cases for i and s, U+0130, and the Kelvin sign; no other letter does, nor lowers to an
# ASCII one): with them mapped first and the ASCII letters lowered, a text holds a folded
# ASCII literal wherever `re` would match it.
_ASCII_FOLDS = {0x130: "i", 0x131: "i", 0x17F: "s", 0x212A: "k"}

WINDOW_PAD = 8
# (prefilter, a line's bytes with their digits zeroed) -> possible(): see possible_in
_SHAPES: dict[tuple[int, bytes], list[int]] = {}
_UIDS = itertools.count()
SHAPE_MAX = 512  # bytes of the longest line kept by its shape (a longer one rarely repeats)
SHAPES_KEPT = 4096  # shapes kept, all prefilters together (at most 2 MiB)
POSSIBLE_KEPT = 1024  # combinations of literals present whose possible alternatives are kept
WINDOW_WIDEST = 4096  # an alternative that can match more is searched whole


# Each kept as one (text, result) pair, replaced whole: a reader in another thread sees a
# pair that belongs together whatever the interpreter (a library user may scan from several
# threads; two item stores in a row are atomic only by CPython's choice of switch points).
_last: list[tuple[str, str]] = [("", ""), ("", "")]  # the last two texts folded: rules share one line
# the last long text encoded (a 200 KB dump once, not per rule), and the last text reversed
# (its runs' left edges, for every rule)
_last_long: list[tuple[str, Any]] = [("", b"")]
_last_reversed: list[tuple[str, Any]] = [("", "")]


def _fold(text: str) -> str:
    newest, older = _last
    if newest[0] is text:
        return newest[1]
    if older[0] is text:  # a line's text and its message alternate: two are kept
        return older[1]
    if text.isascii():
        folded = text.lower()
    else:
        # only an ASCII literal is looked for in a non-ASCII text (haystack()): its ASCII
        # letters lowered, and the four letters `re` folds into ASCII ones mapped, hold it
        # wherever `re` matches it, at the same offsets (str.lower of a 200 KB non-ASCII
        # request dump takes ~0.9 ms; this, a few hundred microseconds)
        # (translate is slow, a dict lookup per character: only where one of them is there)
        mapped = text.translate(_ASCII_FOLDS) if any(chr(c) in text for c in _ASCII_FOLDS) else text
        folded = mapped.encode("utf-8", "surrogatepass").lower().decode("utf-8", "surrogatepass")
    _last[:] = [(text, folded), newest]
    return folded


def _encoded(hay: str) -> bytes:
    return hay.encode() if len(hay) < 4096 else _last_of(_last_long, hay, str.encode)  # type: ignore[no-any-return]


def _reversed(text: str) -> str:
    return _last_of(_last_reversed, text, lambda t: t[::-1])  # type: ignore[no-any-return]


def _last_of(slot: list[tuple[str, Any]], text: str, make: Any) -> Any:
    """make(text), kept in the slot for the next caller asking about the same text object."""
    pair = slot[0]
    if pair[0] is not text:
        pair = slot[0] = (text, make(text))
    return pair[1]
