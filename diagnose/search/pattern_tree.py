"""What a pattern's parse tree says of the texts it can match, read from `re._parser`'s tree
(which `re.compile` builds anyway): how wide a match can be, which characters one can begin
with or hold, whether it reads past its match, and whether it tells one digit from another.
Every answer errs on the safe side: where the tree says nothing certain, "it may".
"""

from __future__ import annotations

import re
from re import _constants as C  # type: ignore[attr-defined]
from re import _parser  # type: ignore[attr-defined]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT, getattr(C, "POSSESSIVE_REPEAT", C.MAX_REPEAT))
_TREES: dict[tuple[str, int], Any] = {}  # (pattern, flags) -> its parse tree (None: it does not parse)


def _parse(pattern: str, flags: int = 0) -> Any:
    """`re`'s parse tree of the pattern; None where it does not parse."""
    try:
        return _parser.parse(pattern, flags)
    except re.error:
        return None


def parse_tree(pattern: str, flags: int = 0) -> Any:
    """`re`'s parse tree of the pattern (None where it does not parse), kept: the same few
    patterns are read again and again (the prefix layers, a rule's alternatives)."""
    key = (pattern, flags)
    tree = _TREES.get(key, False)
    if tree is False:
        tree = _TREES[key] = _parse(pattern, flags)
    return tree


def children(op: Any, av: Any) -> list[Any]:
    """The sequences inside one node of a parse tree (a group, an atomic group, the branches of
    an alternation, a repeat's body): what every walk of the tree descends into."""
    if op is C.SUBPATTERN:
        return [av[3].data]
    if op is C.ATOMIC_GROUP:
        return [av.data]
    if op is C.BRANCH:
        return [b.data for b in av[1]]
    if op in REPEATS:
        return [av[2].data]
    return []


def changes_case(seq: Any) -> bool:
    """Does a scoped flag group (`(?i:…)`, `(?-i:…)`) switch case folding anywhere?"""
    return any(
        (op is C.SUBPATTERN and (av[1] | av[2]) & re.IGNORECASE)
        or any(changes_case(child) for child in children(op, av))
        for op, av in seq
    )


def width(pattern: str, widest: int) -> int | None:
    """The most characters a match spans, up to `widest`; None where it may be more (or a
    lookaround or a group reference reads past the match)."""
    tree = parse_tree(pattern)
    if tree is None or _reads_past(tree.data):
        return None
    hi = tree.getwidth()[1]
    return hi if hi <= widest else None


def _reads_past(seq: Any) -> bool:
    """Does a lookaround or a group reference (what it reads is not bounded by the match) occur?"""
    return any(
        op in (C.ASSERT, C.ASSERT_NOT, C.GROUPREF, C.GROUPREF_EXISTS)
        or any(_reads_past(child) for child in children(op, av))
        for op, av in seq
    )


_CATEGORY_CLASSES = {
    C.CATEGORY_DIGIT: r"\d",
    C.CATEGORY_NOT_DIGIT: r"\D",
    C.CATEGORY_SPACE: r"\s",
    C.CATEGORY_NOT_SPACE: r"\S",
    C.CATEGORY_WORD: r"\w",
    C.CATEGORY_NOT_WORD: r"\W",
}


def edge_chars(pattern: str) -> Any:
    """A character class of the ASCII characters no match of the pattern consumes, each tested
    with `re` itself against what the pattern's parts consume (case-folded where any part is);
    None where there is none or the pattern reads past its match."""
    tree = parse_tree(pattern)
    if tree is None or _reads_past(tree.data):
        return None
    parts: list[str] = []
    if not _consumers(tree.data, parts) or not parts:
        return None
    fold = bool(tree.state.flags & re.IGNORECASE) or changes_case(tree.data)
    one = re.compile(("(?i)" if fold else "") + "(?:" + "|".join(parts) + ")")
    edge = [c for c in map(chr, range(128)) if c != "\n" and not one.fullmatch(c)]
    return re.compile("[" + "".join(_char(ord(c)) for c in edge) + "]") if edge else None


def _consumers(seq: Any, parts: list[str]) -> bool:
    """Each part of the sequence that consumes a character, as a one-character pattern; False
    where one cannot be written."""
    for op, av in seq:
        if op is C.LITERAL:
            parts.append(_char(av))
        elif op is C.NOT_LITERAL:
            parts.append("[^" + _char(av) + "]")
        elif op is C.ANY:
            parts.append("[^\\n]")  # `(?s)` would add the newline, which no line holds
        elif op is C.IN:
            got = _set(av)
            if got is None:
                return False
            parts.append(got)
        elif op is C.AT:
            continue  # zero width: what it reads next to the match is within WINDOW_PAD
        elif op in (C.SUBPATTERN, C.ATOMIC_GROUP, C.BRANCH, *REPEATS):
            if not all(_consumers(child, parts) for child in children(op, av)):
                return False
        else:
            return False
    return True


def _set(items: Any) -> str | None:
    out = []
    for op, av in items:
        if op is C.NEGATE:
            out.insert(0, "^")
        elif op is C.LITERAL:
            out.append(_char(av))
        elif op is C.RANGE:
            out.append(_char(av[0]) + "-" + _char(av[1]))
        elif op is C.CATEGORY and av in _CATEGORY_CLASSES:
            out.append(_CATEGORY_CLASSES[av])
        else:
            return None
    return "[" + "".join(out) + "]"


def _char(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def can_start_with(pattern: re.Pattern[str], c: str) -> bool:
    """Can a non-empty match of the pattern begin with the character c? (Never False where it
    can: an anchored layer skipped on this answer would have matched nothing.)"""
    if not isinstance(pattern, re.Pattern):
        return True  # a user's layer, on `regex` (its syntax is not `re`'s): always tried
    tree = parse_tree(pattern.pattern, pattern.flags & ~re.UNICODE)
    if tree is None:
        return True
    return _starts(tree.data, c, bool(tree.state.flags & re.IGNORECASE))[0]


def _starts(seq: Any, c: str, fold: bool) -> tuple[bool, bool]:
    """(a match of the sequence can begin with c, the sequence can match empty)."""
    for op, av in seq:
        can, empty = _op_starts(op, av, c, fold)
        if can:
            return True, empty
        if not empty:
            return False, False
    return False, True


def _op_starts(op: Any, av: Any, c: str, fold: bool) -> tuple[bool, bool]:
    if op is C.LITERAL:
        return _same_char(chr(av), c, fold), False
    if op is C.IN:
        return _in_set(av, c, fold), False
    if op is C.SUBPATTERN:
        inner_fold = (fold or bool(av[1] & re.IGNORECASE)) and not av[2] & re.IGNORECASE
        return _starts(av[3].data, c, inner_fold)
    if op is C.ATOMIC_GROUP:
        return _starts(av.data, c, fold)
    if op is C.BRANCH:
        outs = [_starts(b.data, c, fold) for b in av[1]]
        return any(o[0] for o in outs), any(o[1] for o in outs)
    if op in REPEATS:
        can, empty = _starts(av[2].data, c, fold)
        return can, empty or av[0] == 0
    if op in (C.AT, C.ASSERT, C.ASSERT_NOT):  # zero width: what follows starts the match
        return False, True
    return True, True  # ANY, NOT_LITERAL, group references…: anything may


def _same_char(x: str, c: str, fold: bool) -> bool:
    if x == c:
        return True
    return fold and (x.isalpha() or not x.isascii()) and (c.isalpha() or not c.isascii())


_CATEGORY_TESTS = {
    C.CATEGORY_DIGIT: lambda c: bool(re.match(r"\d", c)),
    C.CATEGORY_NOT_DIGIT: lambda c: bool(re.match(r"\D", c)),
    C.CATEGORY_SPACE: lambda c: bool(re.match(r"\s", c)),
    C.CATEGORY_NOT_SPACE: lambda c: bool(re.match(r"\S", c)),
    C.CATEGORY_WORD: lambda c: bool(re.match(r"\w", c)),
    C.CATEGORY_NOT_WORD: lambda c: bool(re.match(r"\W", c)),
}


def _in_set(items: Any, c: str, fold: bool) -> bool:
    negate = False
    hit = False
    for op, av in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            hit = hit or _same_char(chr(av), c, fold)
        elif op is C.RANGE:
            lo, hi = av
            hit = hit or lo <= ord(c) <= hi or (fold and (c.isalpha() or not c.isascii()))
        elif op is C.CATEGORY:
            test = _CATEGORY_TESTS.get(av)
            hit = hit or test is None or test(c)
        else:
            return True  # anything else: it may
    if negate:
        # a negated set with folding: a letter may fold into the set; say it may match
        return not hit or (fold and (c.isalpha() or not c.isascii()))
    return hit


# zeroes every ASCII digit: a text and its zeroed copy match a digit-blind pattern alike, and
# hold a literal without digits at the same places (line shapes: literals.py, prefixes.py)
ZERO_DIGITS = bytes.maketrans(b"123456789", b"000000000")


def digit_blind(pat: re.Pattern[str]) -> bool:
    """Does the pattern read every ASCII digit alike (a class of digits, `\\d`, `\\w`, never
    one digit or a range of some), with no back-reference: then a text with its digits
    changed matches where the text matches, with the same spans."""
    if not isinstance(pat, re.Pattern):
        return False  # a user's layer, on `regex`: not read here, so no plan is kept
    tree = parse_tree(pat.pattern, pat.flags & ~re.UNICODE)
    return tree is not None and _blind(tree.data)


def _blind(seq: Any) -> bool:
    for op, av in seq:
        if op in (C.LITERAL, C.NOT_LITERAL):
            if chr(av).isascii() and chr(av).isdigit():
                return False
        elif op is C.IN:
            for iop, iav in av:
                if iop is C.LITERAL and chr(iav).isascii() and chr(iav).isdigit():
                    return False
                if iop is C.RANGE and not (iav[1] < 48 or iav[0] > 57 or (iav[0] <= 48 and iav[1] >= 57)):
                    return False
        elif op in (C.GROUPREF, C.GROUPREF_EXISTS):
            return False
        elif op in (C.ASSERT, C.ASSERT_NOT):
            if not _blind(av[1].data):
                return False
        elif not all(_blind(child) for child in children(op, av)):
            return False
    return True
