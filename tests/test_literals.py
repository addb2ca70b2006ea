"""The literal prefilter (literals.py) never changes a match: a shipped pattern searched through
it gives the span and groups plain `re` gives, on the rules' own examples, on every line of the
real logs that wakes the pattern, on over-long lines and on generated text."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.search import literals, patterns
from diagnose.search.literals import Prefilter, required, top_alternatives
from diagnose.search.pattern_tree import can_start_with
from diagnose.search.patterns import ShippedPattern

from .conftest import REAL_LOGS
from .test_patterns import _shipped


def _same(plain: re.Pattern[str], sp: ShippedPattern, text: str) -> bool:
    a, b = plain.search(text), sp.search(text)
    return (a and (a.span(), a.groupdict())) == (b and (b.span(), b.groupdict()))


@pytest.fixture
def prefilter_at_once(monkeypatch):
    monkeypatch.setattr(patterns, "PREFILTER_AFTER", 0)


def _items(know) -> list[tuple[str, str, list[str], list[str]]]:
    return _shipped(know)  # every shipped rule's and marker's pattern, needles and examples


def test_required_literals_of_real_patterns():
    assert required("address already in use") == ([frozenset({"address already in use"})], False)
    need, fold = required(r"(?i)checkpoint (?:is )?(?:corrupt|incomplete|invalid)")  # type: ignore[misc]
    assert (
        fold
        and need[0] == frozenset({"checkpoint "})
        and frozenset({"corrupt", "incomplete", "invalid"}) in need
    )
    assert required(r"\w+=\d+") is None  # nothing proved: nothing skipped
    assert required(r"(?:foo)?ba\d") is None  # an optional group and a short run prove nothing
    assert required(r"(?:CUDA|HIP) out of memory")[0][0] == frozenset({" out of memory"})  # type: ignore[index]


def test_alternatives_are_split_only_where_it_is_safe():
    assert top_alternatives("(?i)a[|]b|c(d|e)|\\|f") == ["(?i)a[|]b", "(?i)c(d|e)", "(?i)\\|f"]
    assert top_alternatives("x[]|]y|z") == ["x[]|]y", "z"]
    assert top_alternatives("(a)x|\\1y") is None  # a back-reference ties two alternatives
    assert top_alternatives("(?P<a>a)x|(?P=a)") is None
    assert top_alternatives("(?x) a | b  # c|d") is None  # verbose: `|` may be in a comment
    assert top_alternatives("(?:a|b)c") is None


def test_an_alternative_with_no_literal_proved_is_tried_on_every_text():
    pf = Prefilter(r"(?i)out of memory|\w+=\d+")
    assert pf.useful and pf.split
    assert pf.possible("tp=2") == [1]
    assert pf.possible("cuda out of memory, tp=2") == [0, 1]
    assert not Prefilter(r"\w+=\d+|\d+:\d+").useful  # nothing proved anywhere: searched whole


def test_every_shipped_pattern_gives_the_same_match_on_its_examples(know, prefilter_at_once):
    checked = 0
    for rid, pattern, _, examples in _items(know):
        plain, sp = re.compile(pattern), ShippedPattern(pattern)
        for text in examples:
            assert _same(plain, sp, text), (rid, text)
            checked += 1
    assert checked > 500


@pytest.mark.skipif(not REAL_LOGS.is_dir(), reason="../shared/real-logs is absent")
@pytest.mark.parametrize(
    ("long_from", "windowed_from"),
    [(patterns.LONG_LINE, patterns.WINDOWED_FROM), (120, 120), (patterns.LONG_LINE, 0)],
    ids=["as-shipped", "timed-windows-from-120", "windows-on-every-line"],
)
def test_every_shipped_pattern_gives_the_same_match_on_every_real_line_it_wakes(
    know, prefilter_at_once, monkeypatch, long_from, windowed_from
):
    """With the limits lowered, most lines take the windowed path (on `regex` under the
    timeout, or on `re`): the same matches."""
    monkeypatch.setattr(patterns, "LONG_LINE", long_from)
    monkeypatch.setattr(patterns, "WINDOWED_FROM", windowed_from)
    if windowed_from == 0:  # and every text's literals found by the long texts' presence test
        monkeypatch.setattr(literals, "LONG_TEXT", 0)
    import ahocorasick_rs

    lines: list[str] = []
    for p in sorted(REAL_LOGS.glob("*/log.txt")):
        lines += p.read_text(errors="replace").splitlines()
    items = _items(know)
    needles = sorted({n for _, _, ns, _ in items for n in ns})
    ac = ahocorasick_rs.AhoCorasick(needles)
    woken: dict[str, list[str]] = {}  # needle -> the lines holding it
    for text in lines:
        for i in {m[0] for m in ac.find_matches_as_indexes(text, overlapping=True)}:
            woken.setdefault(needles[i], []).append(text)
    checked = 0
    for rid, pattern, ns, _ in items:
        plain, sp = re.compile(pattern), ShippedPattern(pattern)
        for text in dict.fromkeys(t for n in ns for t in woken.get(n, ())):
            assert _same(plain, sp, text), (rid, text[:200])
            checked += 1
    assert checked > 20_000


def test_over_long_lines_give_the_same_match(know, prefilter_at_once):
    filler = "x=1, " * (patterns.LONG_LINE // 5 + 10)
    for rid, pattern, _, examples in _items(know)[:60]:
        plain, sp = re.compile(pattern), ShippedPattern(pattern)
        for e in examples[:2]:
            for text in (filler + e, e + filler, filler + e + filler):
                assert _same(plain, sp, text), rid


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        (r"(?i)mission failed", "MİSSİON FAILED"),  # U+0130: `re` folds it to i; str.lower to two characters
        (r"(?i)disk full|process died", "proceſs died"),  # U+017F long s: `re` folds it to s
        (r"(?i)init failed|link down", "lınk down"),  # U+0131 dotless i
        (r"(?i)KELVIN|cuda error", "CUDA ERROR"),
        (r"(?i:received signal) SIGTERM|Exit Code 143", "RECEIVED SIGNAL SIGTERM"),
    ],
)
def test_case_folding_is_never_narrower_than_re(pattern, text, prefilter_at_once):
    plain, sp = re.compile(pattern), ShippedPattern(pattern)
    assert plain.search(text) is not None
    assert _same(plain, sp, text)


_WORDS = [
    "out of memory",
    "CUDA",
    "error",
    "tokenizer",
    "not supported",
    "port",
    "in use",
    "bind",
    "é",
    "İ",
    "ſ",
]


@settings(max_examples=1000, deadline=None)
@given(
    st.lists(st.one_of(st.sampled_from(_WORDS), st.text(max_size=8)), max_size=12).map(" ".join),
    st.sampled_from(
        [
            r"(?i)(?:load|find|open)\w* (?:the )?tokenizer|tokenizer\S* (?:not found|failed)|unsupported (?:model|dtype)",
            r"(?i)address already in use|port \d+ is (?:already )?(?:in use|taken)|(?:failed to|unable to) bind",
            r"CUDA (?:error|out of memory)|(?P<what>\w+) not supported|(?i:ERROR) in \w+",
            r"^error: (?P<msg>.+)$|\bout of memory\b",
        ]
    ),
)
def test_generated_text_gives_the_same_match(text, pattern):
    plain = re.compile(pattern)
    for windowed_from in (patterns.WINDOWED_FROM, 0):  # (hypothesis reruns the body: no fixture)
        sp = ShippedPattern(pattern)
        sp._prefilter = Prefilter(pattern)  # at once
        saved, patterns.WINDOWED_FROM = patterns.WINDOWED_FROM, windowed_from
        try:
            assert _same(plain, sp, text), windowed_from
        finally:
            patterns.WINDOWED_FROM = saved


def test_an_unbounded_alternative_is_searched_in_the_run_around_its_literal():
    """`\\w* (?:the )?tokenizer` can start anywhere before its literal, but only within the
    run of characters it can hold: the window ends at the comma and the quote around it."""
    pf = Prefilter(r"(?i)(?:load|find|open)\w* (?:the )?tokenizer|tokenizer\S* not found")
    text = "x" * 3000 + ", tokenizer_path='Qwen/Qwen2.5-7B', Loading the Tokenizer now" + "y" * 3000
    hay = text.lower()
    (lo, hi), (lo2, hi2) = pf.windows(0, hay, text)  # type: ignore[misc]
    assert text[lo + 8 : hi - 8] == " tokenizer_path"  # (WINDOW_PAD each side)
    assert text[lo2 + 8 : hi2] == " Loading the Tokenizer now" + "y" * 3000  # (to the end)
    # `\\S*` and a space hold every character but tabs and the like: the run is the line
    full = text + " tokenizer.json not found"
    assert pf.windows(1, full.lower(), full) == [(0, len(full))]
    assert Prefilter(r"tokenizer.* not found").windows(0, hay, text) is None  # `.`: no edge at all
    sp = ShippedPattern(r"(?i)(?:load|find|open)\w* (?:the )?tokenizer|tokenizer\S* not found")
    sp._prefilter = pf
    assert sp.search(text).group(0) == "Loading the Tokenizer"  # type: ignore[union-attr]


def _real_lines() -> list[str]:
    lines: list[str] = []
    for p in sorted(REAL_LOGS.glob("*/log.txt")):
        lines += p.read_text(errors="replace").splitlines()
    return lines


@pytest.mark.skipif(not REAL_LOGS.is_dir(), reason="../shared/real-logs is absent")
def test_a_line_layer_skipped_by_its_first_character_matches_nothing_there(know):
    """can_start_with never says no where the layer matches: on every real line, and on each
    of its suffixes where a layer came off (the next layer is tried there)."""
    layers = know.profiles.layout.prefixes
    checked = 0
    for text in _real_lines()[::3]:
        s = text[:300]
        for _ in range(4):
            if not s:
                break
            matched = None
            for p in layers:
                m = p.match(s)
                if m and m.end():
                    assert can_start_with(p, s[0]), (p.pattern, s[:80])
                    checked += 1
                    matched = matched or m
            if matched is None:
                break
            s = s[matched.end() :]
    assert checked > 5_000


@pytest.mark.skipif(not REAL_LOGS.is_dir(), reason="../shared/real-logs is absent")
def test_splitting_with_layers_chosen_by_first_character_gives_the_same_fields(know, monkeypatch):
    from diagnose.model.records import Line
    from diagnose.read import prefixes as layout_module

    lines = _real_lines()[::2]
    fields = ("level", "timestamp", "pid", "process", "rank", "location", "message")

    def split_all() -> list[tuple[object, ...]]:
        lay = know.profiles.layout.fresh()
        out = []
        for i, text in enumerate(lines):
            line = lay.split(Line(source="s", number=i, text=text))
            out.append(tuple(getattr(line, k) for k in fields))
        return out

    monkeypatch.setattr(layout_module, "DISPATCH_AFTER", 0)
    chosen = split_all()
    monkeypatch.setattr(layout_module, "DISPATCH_AFTER", 10**9)
    assert split_all() == chosen


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("[]()|: \t-_.aZ09IEWé│>")), min_size=1, max_size=30))
def test_first_character_choice_on_generated_text(text):
    from diagnose.read.prefixes import _HEAD, _MID, _TAIL

    for p in (*_HEAD, *_MID, *_TAIL):
        m = p.match(text)
        if m and m.end():
            assert can_start_with(p, text[0]), p.pattern


def test_a_non_ascii_text_is_folded_where_an_ascii_literal_can_be():
    """A non-ASCII text has only its ASCII letters lowered (and the letters `re` folds into
    ASCII ones mapped): every character no ASCII literal can match stays as it is, the offsets
    stay, and the ASCII characters are those full lowering gives. No other code point lowers
    to, or is matched by `re` as, an ASCII letter."""
    import sys

    every = "".join(chr(c) for c in range(128, sys.maxunicode + 1) if not 0xD800 <= c < 0xE000)
    assert {ord(c) for c in re.findall(r"(?i)[a-z]", every)} == set(literals._ASCII_FOLDS)
    assert {ord(c) for c in every if any(x.isascii() for x in c.lower())} <= set(literals._ASCII_FOLDS)
    text = "KELVIN \u212a İSTANBUL lınk proceſs Straße ΣΊΣΥΦΟΣ — out of MEMORY \udc80 ok"
    folded = literals._fold(text)
    assert len(folded) == len(text)
    full = text.translate(literals._ASCII_FOLDS).lower()
    # offset by offset: the same ASCII character, or a non-ASCII one in both
    assert all(a == b or not (a.isascii() or b.isascii()) for a, b in zip(folded, full, strict=True))
    assert "out of memory" in folded and "kelvin k istanbul link process" in folded


_PLAIN_LAYOUT_START = re.compile(
    r"\(\w[\w-]*(?: pid=\d+)?\)|\[\d{4}-\d\d-\d\d|\d{4}-\d\d-\d\dT\d|\b(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b"
)
_LAYOUT_ATOMS = [
    "DEBUG",
    "INFO",
    "WARNING",
    "WARN",
    "WARNINGS",
    "ERROR",
    "CRITICAL",
    "xINFO",
    "_ERROR",
    "(a)",
]
_LAYOUT_ATOMS += [
    "(x-y pid=12)",
    "[2024-01-02",
    "2024-01-02T1",
    "٢٠٢٤-01-02T1",
    " ",
    "|",
    ":",
    "a",
    "1",
    "é",
    "(",
    "[",
]


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(_LAYOUT_ATOMS), min_size=1, max_size=12).map("".join), st.integers(0, 200))
def test_where_a_layout_may_start_is_the_plain_alternations_answer(text, end):
    """The wrapper search's pattern (written to skip to a match's first characters) finds the
    same spans as the plain alternation, from the second character as the splitter asks."""
    from diagnose.read.prefixes import _LAYOUT_START

    plain = [m.span() for m in _PLAIN_LAYOUT_START.finditer(text, 1, end)]
    assert [m.span() for m in _LAYOUT_START.finditer(text, 1, end)] == plain


@pytest.mark.skipif(not REAL_LOGS.is_dir(), reason="../shared/real-logs is absent")
def test_where_a_layout_may_start_on_every_real_line():
    from diagnose.read.prefixes import _LAYOUT_START

    for text in _real_lines():
        end = min(len(text), 160)
        assert [m.span() for m in _LAYOUT_START.finditer(text, 1, end)] == [
            m.span() for m in _PLAIN_LAYOUT_START.finditer(text, 1, end)
        ]


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.lists(
            st.one_of(
                st.sampled_from([*_WORDS, "12", "0", "98", "[errno 98]", "errno 9"]), st.text(max_size=4)
            )
        )
        .map(" ".join)
        .map(str.lower),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(
        [
            r"(?i)(?:load|find|open)\w* (?:the )?tokenizer|tokenizer\S* (?:not found|failed)|unsupported (?:model|dtype)",
            r"(?i)address already in use|\[errno 98\]|port \d+ is (?:already )?(?:in use|taken)",
            r"CUDA (?:error|out of memory)|(?P<what>\w+) not supported|(?i:ERROR) in \w+",
        ]
    ),
)
def test_a_lines_shape_gives_the_possible_alternatives_its_literals_give(texts, pattern):
    """Lines kept by their shape (digits zeroed) get the alternatives their own literals give:
    the same as a prefilter that keeps no shape, line after line (digits vary, words do not);
    a literal holding a digit turns the shapes off."""
    kept, plain = Prefilter(pattern), Prefilter(pattern)
    plain._digitless = False
    assert kept._digitless == ("98" not in pattern)
    for text in texts + [t.replace("1", "7") for t in texts]:
        data = text.encode()
        assert kept.possible_in(data) == plain.possible_in(data), text
