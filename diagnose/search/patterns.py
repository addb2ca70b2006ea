"""Rule and marker patterns: which engine compiles them, and a search that cannot hang.

Patterns shipped with diagnose (the package's rules/) run on Python's `re`: they compile in
a fifth of the time the `regex` module takes, with no import, and compiling is most of a
short scan's work. `re` has no timeout, so the suite screens every shipped pattern on
adversarial lines of LONG_LINE characters (tests/test_patterns.py: each must finish well
within PATTERN_TIMEOUT_S), and a longer line — rare, and where even a linear pattern's
constant factor starts to tell — is searched with the same pattern on `regex` under the
timeout. Patterns from the user's own files had no screening: they always run on `regex`
under the timeout, so a pathological one costs a missed match, never a hung scan.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

PATTERN_TIMEOUT_S = 0.25
LONG_LINE = 32 << 10  # characters: longer texts are searched under the timeout
PREFILTER_AFTER = 4  # searches of a pattern after which its literals are worked out
# characters from which a text's possible alternatives are searched only around their literals
# (below, a window's bookkeeping costs more than `re` reading the whole text)
WINDOWED_FROM = 1024


class PatternError(ValueError):
    """The pattern does not compile (the message says why)."""


GIVE_UP_AFTER = 3  # timeouts after which a pattern is not tried again in this process
# pattern text -> how many searches timed out (read by the scan to name the rule in a warning)
TIMED_OUT: dict[str, int] = {}


class TimedPattern:
    """A `regex` pattern whose searches give up (no match) after PATTERN_TIMEOUT_S; after
    GIVE_UP_AFTER timeouts it is not tried again (a backtracking pattern would otherwise cost
    a quarter second on every candidate line), and TIMED_OUT says so."""

    __slots__ = ("_compiled", "_timeouts")

    def __init__(self, compiled: Any):
        self._compiled = compiled
        self._timeouts = 0

    @property
    def pattern(self) -> str:
        return str(self._compiled.pattern)

    @property
    def groupindex(self) -> dict[str, int]:
        return dict(self._compiled.groupindex)

    @property
    def groups(self) -> int:
        return self._compiled.groups

    def search(self, text: str, pos: int = 0, endpos: int | None = None) -> Any:
        return self._timed(self._compiled.search, text, pos, endpos)

    def match(self, text: str, pos: int = 0) -> Any:
        """Anchored at pos (a user profile's line prefixes; a shipped pattern's alternative)."""
        return self._timed(self._compiled.match, text, pos)

    def _timed(self, how: Any, text: str, pos: int = 0, endpos: int | None = None) -> Any:
        if self._timeouts >= GIVE_UP_AFTER:
            return None
        try:
            return how(text, pos, endpos, timeout=PATTERN_TIMEOUT_S)
        except TimeoutError:
            self._timeouts += 1
            TIMED_OUT[self._compiled.pattern] = TIMED_OUT.get(self._compiled.pattern, 0) + 1
            return None


class ShippedPattern:
    """A screened pattern: `re` up to LONG_LINE characters, `regex` under the timeout beyond;
    after PREFILTER_AFTER searches, texts without the literals a match needs are not searched,
    and only the alternatives whose literals are there are (literals.py)."""

    __slots__ = ("_alts", "_prefilter", "_re", "_searches", "_source", "_timed")

    def __init__(self, pattern: str, prefilter: bool = True, checked: bool = False):
        """`checked`: the pattern compiled cleanly before (the validated-data cache), so it is
        compiled on its first search: a line its literals rule out never pays for it (a
        vocabulary's alternation is milliseconds to compile, its literals a fraction)."""
        self._source = pattern
        self._re: re.Pattern[str] | None = None
        if not checked:
            try:
                self._re = re.compile(pattern)
            except re.error as e:
                raise PatternError(str(e)) from None
        self._timed: TimedPattern | None = None
        self._searches = 0
        # literals.Prefilter once built; False where it has no use (or is not wanted)
        self._prefilter: Any = None if prefilter else False
        self._alts: dict[tuple[int, bool], Any] = {}  # (alternative, over LONG_LINE) -> compiled

    @property
    def _compiled(self) -> re.Pattern[str]:
        if self._re is None:
            self._re = re.compile(self._source)
        return self._re

    @property
    def pattern(self) -> str:
        return self._source

    @property
    def groupindex(self) -> dict[str, int]:
        return dict(self._compiled.groupindex)

    @property
    def groups(self) -> int:
        return self._compiled.groups

    def _built_prefilter(self) -> Any:
        from .literals import Prefilter

        pf = Prefilter(self._source)
        self._prefilter = pf = pf if pf.useful else False
        return pf

    def may_match(self, text: str) -> bool:
        """False only where the text lacks what every match needs (no search is run)."""
        pf = self._prefilter
        if pf is None:
            pf = self._built_prefilter()
        if not pf:
            return True
        hay = pf.haystack(text)
        return hay is None or bool(pf.possible(hay))

    def may_match_ascii(self, raw: bytes, lowered: bytes) -> bool:
        """may_match() of an ASCII text given as its bytes and them lowered (haystack()'s
        folding of an ASCII text, encoded), without decoding it."""
        pf = self._prefilter
        if pf is None:
            pf = self._built_prefilter()
        if not pf:
            return True
        return bool(pf.possible_in(lowered if pf.fold else raw))

    def search(self, text: str) -> Any:
        pf = self._prefilter
        if pf is None:
            self._searches += 1
            if self._searches >= PREFILTER_AFTER:  # a pattern searched a few times: worth it
                pf = self._built_prefilter()
        long = len(text) > LONG_LINE
        if pf:
            hay = pf.haystack(text)
            if hay is not None:
                possible = pf.possible(hay)
                if not possible:
                    return None
                fewer = pf.split and len(possible) < len(pf.alternatives)
                if long or len(text) >= WINDOWED_FROM:
                    found = self._search_windows(text, hay, possible, long, fewer)
                    if found is not _WHOLE:
                        return found
                elif fewer:
                    return self._search_alternatives(text, possible)
        if long:
            return self._timed_whole().search(text)
        return self._compiled.search(text)

    def _timed_whole(self) -> TimedPattern:
        if self._timed is None:
            self._timed = timed_pattern(self._source)
        return self._timed

    def _alternative(self, i: int, timed: bool) -> Any:
        alt = self._alts.get((i, timed))
        if alt is None:
            source = self._prefilter.alternatives[i][0]
            alt = self._alts[(i, timed)] = timed_pattern(source) if timed else re.compile(source)
        return alt

    def _search_alternatives(self, text: str, possible: list[int]) -> Any:
        """The whole pattern's match, found where the earliest possible alternative matches."""
        found = (self._alternative(i, False).search(text) for i in possible)
        return _match_at_earliest(self._compiled, text, [m.start() for m in found if m is not None])

    def _search_windows(self, text: str, hay: str, possible: list[int], long: bool, fewer: bool) -> Any:
        """A long text: each possible alternative searched only in the windows around its
        literals (a few hundred characters each, on `re`), the whole pattern then matched once
        where the earliest starts (under the timeout on an over-long line). _WHOLE where a
        search of the whole pattern costs less: a text under LONG_LINE where some alternative
        has no window and none is ruled out."""
        pf = self._prefilter
        windows = [pf.windows(i, hay, text) for i in possible]
        if not long and not fewer and None in windows:
            return _WHOLE
        starts = []
        for i, w in zip(possible, windows, strict=True):
            s = self._first_start(i, text, w, long)
            if s is not None:
                starts.append(s)
        return _match_at_earliest(self._timed_whole() if long else self._compiled, text, starts)

    def _first_start(
        self, i: int, text: str, windows: list[tuple[int, int]] | None, long: bool
    ) -> int | None:
        if windows is None:  # no window: the alternative on the whole text
            m = self._alternative(i, long).search(text)
            return None if m is None else int(m.start())
        for lo, hi in windows:
            pat = self._alternative(i, hi - lo > LONG_LINE)
            pos = lo
            while pos <= hi:
                m = pat.search(text, pos, hi)
                if m is None:
                    break
                # the window's end reads as the text's end (`$`, `\b`): check on the whole text
                if pat.match(text, m.start()) is not None:
                    return int(m.start())
                pos = m.start() + 1
        return None


_WHOLE = object()  # _search_windows: search the whole pattern instead


def _match_at_earliest(whole: Any, text: str, starts: list[int]) -> Any:
    """The whole pattern's match at the earliest start an alternative found (at the leftmost
    position where any alternative matches, the alternation takes the first that does: the
    match `search` gives)."""
    if not starts:
        return None
    m = whole.match(text, min(starts))
    return m if m is not None else whole.search(text)


def timed_pattern(pattern: str) -> TimedPattern:
    """A pattern on `regex` under the timeout (a user's, or a shipped one on an over-long line)."""
    import regex  # only for user patterns and over-long lines

    try:
        return TimedPattern(regex.compile(pattern))
    except regex.error as e:
        raise PatternError(str(e)) from None


def compile_pattern(
    pattern: str, shipped: bool, prefilter: bool = True, checked: bool = False
) -> ShippedPattern | TimedPattern:
    """A compiled pattern with `.search(text)` and `.groupindex`; PatternError if it does not
    compile. `prefilter=False`: a pattern searched only in lines chosen for it (it nearly always
    matches there, so looking for its literals first is only cost). `checked`: it compiled when
    its file validated (a shipped one is then compiled on its first search)."""
    return ShippedPattern(pattern, prefilter, checked) if shipped else timed_pattern(pattern)


def compile_checked(
    pattern: str, path: str, label: str, trusted: bool, shipped: bool, prefilter: bool = True
) -> Any:
    """The compiled pattern of a rule or marker, or None when a validated file lets it compile on
    first use; a pattern that does not compile is a RuleError naming the file, id and field."""
    from ..base.errors import RuleError

    if trusted:
        return None
    try:
        return compile_pattern(pattern, shipped, prefilter)
    except PatternError as e:
        raise RuleError(path, label, "pattern", f"does not compile: {e}") from None
