"""Shipped patterns on `re` (screened here for catastrophic backtracking), user patterns on `regex`
under a timeout, and over-long lines under the timeout whatever the pattern's origin."""

from __future__ import annotations

import re
import time

import pytest
import regex

from diagnose.search.patterns import (
    LONG_LINE,
    PATTERN_TIMEOUT_S,
    PatternError,
    ShippedPattern,
    TimedPattern,
    compile_pattern,
)


def _shipped(know) -> list[tuple[str, str, list[str], list[str]]]:
    items = [
        (r.id, r.pattern, r.needles, r.examples_match + r.examples_no_match)
        for r in know.rules.rules
        if r.shipped
    ]
    items += [(f"{m.engine}.{m.what}", m.pattern, m.needles, m.examples) for m in know.profiles.markers]
    return items


def _adversarial(needles: list[str], examples: list[str], size: int) -> list[str]:
    """Lines that make backtracking patterns work hardest: a needle followed by a long run the
    pattern's classes accept, needles repeated, and examples cut short and repeated."""
    out = []
    for n in needles:
        out += [(n + " ") * (size // (len(n) + 1)), n + " " + "x" * size, n + " " + "0" * size]
        out.append(n + " " + "a b-" * (size // 4))
    for e in examples:
        for frac in (0.25, 0.5, 0.75, 0.9):
            cut = e[: max(1, int(len(e) * frac))]
            out.append(cut * (size // len(cut)))
        out.append((e + " ") * (size // (len(e) + 1)))
    return [line[:size] for line in out]


def test_every_shipped_pattern_is_on_re_and_compiles_on_regex_too(know):
    items = _shipped(know)
    assert len(items) > 150
    assert all(m.shipped for m in know.profiles.markers)
    for rid, pattern, _, _ in items:
        re.compile(pattern)
        regex.compile(pattern)  # over-long lines are searched with it
        assert isinstance(compile_pattern(pattern, shipped=True), ShippedPattern), rid


def test_no_shipped_pattern_backtracks_badly_on_lines_up_to_the_long_line_limit(know):
    """Catastrophic (exponential, or quadratic over a whole run) patterns take seconds here;
    linear ones take milliseconds. The bound is the timeout the same line would get on `regex`."""
    slow = []
    for rid, pattern, needles, examples in _shipped(know):
        compiled = re.compile(pattern)
        for line in _adversarial(needles, examples, LONG_LINE):
            took = float("inf")
            for _ in range(2):  # the faster of two: a busy machine's pause is not backtracking
                t = time.perf_counter()
                compiled.search(line)
                took = min(took, time.perf_counter() - t)
                if took <= PATTERN_TIMEOUT_S:
                    break
            if took > PATTERN_TIMEOUT_S:
                slow.append(f"{rid}: {took:.2f} s on {line[:60]!r}…")
                break
    assert not slow, "\n".join(slow)


def test_user_patterns_run_on_regex_under_the_timeout():
    p = compile_pattern(r"(a+)+$", shipped=False)  # exponential on a near-miss
    assert isinstance(p, TimedPattern)
    t = time.perf_counter()
    assert p.search("a" * 40 + "!") is None  # gave up, as a non-match
    assert time.perf_counter() - t < 10 * PATTERN_TIMEOUT_S
    assert p.search("aaa")[0] == "aaa"
    assert p.groupindex == {}


def test_over_long_lines_are_searched_under_the_timeout_even_for_shipped_patterns():
    p = compile_pattern(r"(?P<n>\d{1,12}) is not divisible by (?P<d>\d+)", shipped=True)
    short = "x 12 is not divisible by 5"
    assert p.search(short)["n"] == "12"
    long = "y" * (LONG_LINE + 10) + short
    m = p.search(long)
    assert m is not None and m["d"] == "5"
    assert isinstance(p._timed, TimedPattern)  # the long line went through regex
    assert p.groupindex == {"n": 1, "d": 2}


@pytest.mark.parametrize("shipped", [True, False])
def test_a_pattern_that_does_not_compile_is_a_pattern_error(shipped):
    with pytest.raises(PatternError):
        compile_pattern("(unclosed", shipped=shipped)
