"""Which lines of a block are worth decoding: one index of every live literal needle (rules,
markers, traceback shapes), markers retired once they can tell nothing new, and the stats
lines found with one rfind per block instead of the index.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable

from ..base.bounded import kept
from ..knowledge.engine_profiles import Marker, Profiles
from ..knowledge.rules import Rule
from ..read.sources import decode
from ..search.needles import make_index

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Needles that only shape tracebacks or count error-looking lines (no rule behind them).
STRUCTURE_NEEDLES = [
    "Traceback (most recent call last)",
    'File "',
    'File \x1b[35m"',  # CPython ≥ 3.13 colours a frame's file name (traceback.py, _colorize: MAGENTA)
    "Error",
    "Exception",
    "Exit",
    "Interrupt",
    "ERROR",
    "CRITICAL",
    "FATAL",
]
# bytes scanned with one set of live needles (by every scan of the process: a thousand short
# streams add up) before its index becomes a DFA (a long log: scanning speed wins)
DFA_AFTER = 4 << 20
# A retired needle stays in the index, its matches skipped (a set lookup each), until it has
# cost this many: then a rebuild (a few milliseconds) pays for itself.
REBUILD_AFTER = 4096
# After a rebuild in the middle of a block (a restart revived needles the index lacks), the
# rest is searched a window at a time, this much first and twice as much after each window
# without another rebuild: a log that restarts every few lines would otherwise search each
# block again per restart, and one that restarts once would pay a call per 16 KiB.
REFIND_WINDOW = 16 << 10
TRACK_AUTOMATON_FROM = 4  # tracked needles from which one automaton pass beats an rfind each
# the last bytes of a block searched first for the latest ready/serving line: a serving log
# has one in its last few lines, and each match in the window costs a call back into Python
# (at 64 KiB, ~200 a block on a serving log; the 108 MB mix's passes 0.137 -> 0.069 s)
TRACK_WINDOW = 4 << 10
BUILT_KEPT = 16  # indexes kept for reuse, by the set of retired markers they were built without
HANDLER_SETS_KEPT = 1024  # needle sets whose live handlers are kept (until a handler retires)


STRUCTURE = frozenset(STRUCTURE_NEEDLES)


def says_nothing(found: set[str], handlers: list[Any], text: str) -> bool:
    """A line only a class's broad words woke ("checkpoint", "port": no error-shaped needle,
    no live marker or rule), where none of those classes' patterns can match (their literals
    are absent): with no traceback or launch dump open, it can say nothing and is not even
    split (a third of a real log's candidate lines). The caller has ruled out error-shaped
    needles (decoded_unless_silent)."""
    return all(isinstance(h, Rule) and h.layer == "vocabulary" and not h.may_match(text) for h in handlers)


def plain_ascii(raw: bytes) -> bool:
    """Do a line's bytes decode to themselves (read.sources.decode): ASCII, with no carriage
    return, no ANSI code, not a JSON record's braces?"""
    return raw.isascii() and b"\r" not in raw and b"\x1b" not in raw and not raw.startswith(b"{")


def says_nothing_ascii(found: set[str], handlers: list[Any], raw: bytes) -> bool:
    """says_nothing() of a plain_ascii line, read on its bytes: not decoded to be dropped (a
    third of a real log's candidate lines are dropped, most of them ASCII)."""
    lowered = raw.lower()  # the folded haystack of an ASCII text, as bytes
    return all(
        isinstance(h, Rule) and h.layer == "vocabulary" and not h.may_match_ascii(raw, lowered)
        for h in handlers
    )


def decoded_unless_silent(found: set[str], handlers: list[Any], raw: bytes) -> tuple[str, bool] | None:
    """The line decoded (read.sources.decode), or None where it says nothing (says_nothing);
    a plain ASCII line is judged on its bytes, and decoded only to be read. A line with an
    error-shaped needle (STRUCTURE) is always read."""
    if not found.isdisjoint(STRUCTURE):
        return decode(raw)
    if plain_ascii(raw):
        return None if says_nothing_ascii(found, handlers, raw) else decode(raw)
    text, truncated = decode(raw)
    return None if says_nothing(found, handlers, text) else (text, truncated)


def _tracks(handler: Any) -> list[tuple[bytes, str]]:
    """A ready or serving marker's needles and phase: once it is retired its lines are still
    followed (Candidates.progress); nothing for any other handler."""
    if isinstance(handler, Marker) and handler.what == "phases" and handler.phase in ("ready", "serving"):
        return [(n.encode("utf-8"), handler.phase) for n in handler.needles]
    return []


def _window_end(block: bytes, start: int, size: int) -> int:
    """Where a search window that begins at `start` ends: a line's end past `size` bytes."""
    nl = block.find(b"\n", start + size)
    return len(block) if nl < 0 else nl + 1


def _observe_only(handlers: list[Any]) -> bool:
    return bool(handlers) and all(
        getattr(h, "what", "") == "observe" and getattr(h, "repeat", False) for h in handlers
    )


class NeedleMap:
    """What the rules and markers of one knowledge need to find their lines: each needle's
    handlers, their order, the phase markers, and the indexes built for each set of retired
    handlers. Built once per process and shared by every scan of that knowledge (a call over
    1,000 small logs built it 1,000 times)."""

    def __init__(self, rules: list[Rule], markers: list[Marker]):
        self.rules, self.markers = rules, markers
        by_needle: dict[str, list[Any]] = defaultdict(list)
        for r in rules:
            for n in r.needles:
                by_needle[n].append(r)
        for m in markers:
            for n in m.needles:
                by_needle[n].append(m)
        for n in STRUCTURE_NEEDLES:
            by_needle.setdefault(n, [])
        self.by_needle = dict(by_needle)
        self.phase_markers: dict[str, list[Marker]] = defaultdict(list)
        for m in markers:
            if m.what == "phases" and m.phase:
                self.phase_markers[m.phase].append(m)
        # Needles only recurring stats lines carry (KV usage, decode batches): only the latest
        # one in a block matters, so they are found with one rfind per block, not the index.
        self.observe_only = {n for n, hs in self.by_needle.items() if _observe_only(hs)}
        # markers first (a line that is both a phase marker and an error happened in that
        # phase), then rules, each in file order so results do not depend on set order
        self.order = {id(m): i for i, m in enumerate(markers)}
        self.order.update({id(r): 10_000 + i for i, r in enumerate(rules)})
        # (retired handlers, DFA or not) -> (index, its needles, needle -> id, the observed
        # needles still live)
        self.built: dict[tuple[frozenset[int], bool], tuple[Any, list[str], dict[str, int], list[str]]] = {}
        # (an index's key, the handlers retired now) -> the ids of that index's needles that
        # lead nowhere now: every session that retires the same markers works it out once
        self.dead: dict[tuple[Any, frozenset[int]], frozenset[int]] = {}
        self.fed: dict[frozenset[int], int] = {}  # bytes scanned with each set of retired handlers
        # a named choice of markers (see Candidates.retire_markers) -> (them by id, the
        # needles and phases of the ready/serving ones among them)
        self.groups: dict[Hashable, tuple[dict[int, Marker], dict[int, list[tuple[bytes, str]]]]] = {}
        self.track_indexes: dict[tuple[bytes, ...], Any] = {}  # a phase's retired needles -> their index


_MAPS: list[NeedleMap] = []  # the maps of the knowledge this process scans with (most recent last)
MAPS_KEPT = 4


def needle_map(rules: list[Rule], markers: list[Marker]) -> NeedleMap:
    for m in _MAPS:
        if m.rules is rules and m.markers is markers:
            return m
    m = NeedleMap(rules, markers)
    _MAPS.append(m)
    if len(_MAPS) > MAPS_KEPT:
        del _MAPS[0]
    return m


class Candidates:
    def __init__(self, rules: list[Rule], profiles: Profiles):
        shared = needle_map(rules, profiles.markers)
        self.markers = profiles.markers
        self.by_needle = shared.by_needle
        self._phase_markers = shared.phase_markers
        self._observe_only = shared.observe_only
        self._order = shared.order
        self._built = shared.built
        self._fed_by_set = shared.fed
        self._groups = shared.groups
        self._dead_by_state = shared.dead
        self.latest_observed: dict[frozenset[str], tuple[int, bytes]] = {}
        # Markers stop being searched once they can tell nothing new (a phase already
        # reached, an engine already decided): a long serving log then has few candidates.
        self.retired: set[int] = set()
        self._handlers_of: dict[frozenset[str], list[Any]] = {}  # handlers(), while `retired` holds
        self._retired_key: frozenset[int] | None = None  # the set frozen, until it changes
        self.dirty = True
        self._index: Any = None
        self.needles: list[str] = []  # the index's needles, by the ids its matches carry
        self._ids: dict[str, int] = {}  # the same, needle -> id
        self._index_key: Any = None
        # ids of the index's needles that lead nowhere since it was built (every handler
        # retired): their matches are skipped, not taken as candidate lines
        self.dead: frozenset[int] = frozenset()
        self._since_build: list[Any] = []  # handlers retired since the index was built
        self._dead_stale = False
        self._dead_upto = 0  # of those, how many `dead` answers for (-1: a revival, ask them all)
        self._observe_live: list[str] = []
        self._dfa = False  # whether the index is the slow-to-build, fast-to-scan kind
        self.skipped = 0  # dead matches skipped since the last build
        self.lacking = False  # revived handlers whose needles the index no longer holds
        self.track: dict[bytes, str] = {}  # retired ready/serving needles, tracked per block
        self._track_indexes = shared.track_indexes
        self.builds = 0  # indexes this scan built (not reused): a restart loop must not build one per restart

    # --- the index -------------------------------------------------------------------------

    def stale(self) -> bool:
        """Time for another index (asked before each block): none yet, revived needles it
        lacks, dead ones that cost more than a rebuild, one without them already built (by an
        earlier run or another session), or enough scanned with these needles for a DFA."""
        if self._index is None or self.lacking:
            return True
        if self.dirty and (self.skipped >= REBUILD_AFTER or self._built_already()):
            return True
        return not self._dfa and (
            self._fed_by_set.get(self._retired_now(), 0) >= DFA_AFTER
            or (self._retired_now(), True) in self._built
        )

    def _retired_now(self) -> frozenset[int]:
        """The retired handlers as an index key (asked after each candidate line while they
        changed: frozen once per change, not per question)."""
        if self._retired_key is None:
            self._retired_key = frozenset(self.retired)
        return self._retired_key

    def _built_already(self) -> bool:
        """An index for the markers retired now exists: switching to it costs nothing (many
        sessions of one process retire the same markers in the same order)."""
        return (self._retired_now(), self._dfa) in self._built

    def build(self) -> None:
        self.skipped = 0
        self.lacking = False
        self.dirty = False
        self.dead, self._since_build, self._dead_stale, self._dead_upto = frozenset(), [], False, 0
        retired = self._retired_now()
        # the first megabytes retire markers quickly: cheap-to-build automata until that settles
        self._dfa = self._fed_by_set.get(retired, 0) >= DFA_AFTER or (retired, True) in self._built
        # a restart revives the same markers each time: the index built for that set is reused,
        # so a log of thousands of restarts costs one build per distinct set, not one per restart
        key = (retired, self._dfa)
        built = self._built.get(key)
        if built is None:
            live = [n for n in self.by_needle if n not in self._observe_only and self.live(n)]
            observe_live = [
                n for n in self._observe_only if any(id(h) not in self.retired for h in self.by_needle[n])
            ]
            index = make_index([n.encode("utf-8") for n in live], fast_build=not self._dfa, blocks=True)
            self.builds += 1
            built = (index, live, {n: i for i, n in enumerate(live)}, observe_live)
            if len(self._built) >= BUILT_KEPT:
                del self._built[next(iter(self._built))]
            self._built[key] = built
        self._index, self.needles, self._ids, self._observe_live = built
        self._index_key = key

    def find(self, block: bytes, offset: int = 0, end: int | None = None) -> list[tuple[int, int]]:
        """(needle id, byte offset) of every needle in block[offset:end], offsets into block;
        a whole block (no offset) counts as fed."""
        if offset or end is not None:
            return [(m[0], m[1] + offset) for m in self._index.find(block[offset:end])]
        retired = self._retired_now()
        if len(self._fed_by_set) >= 4 * BUILT_KEPT and retired not in self._fed_by_set:
            self._fed_by_set.clear()  # a log that retires endlessly new sets: stay bounded
        self._fed_by_set[retired] = self._fed_by_set.get(retired, 0) + len(block)
        return self._index.find(block)  # type: ignore[no-any-return]

    def each_line(self, block: bytes, take: Callable[[int, int, int, set[str]], int]) -> int:
        """`take(pos, start, end, needles)` for each line of the block that holds a live needle,
        in order; `take` says where reading goes on. Matches of needles retired on the way are
        skipped; when markers revive, the index is rebuilt mid-block and the rest searched a
        window at a time. Returns the first byte not taken."""
        n = len(block)
        matches = self.find(block)
        needles, dead = self.needles, self.dead_now() if self._dead_stale else self.dead
        pos = 0  # the first byte not yet taken
        searched = n  # matches cover block[:searched]
        window = REFIND_WINDOW
        i, nm = 0, len(matches)
        while True:
            if i >= nm:
                if searched >= n:
                    return pos
                window *= 2
                begin, searched = searched, _window_end(block, searched, window)
                matches, i = self.find(block, begin, searched), 0
                nm = len(matches)
                continue
            nid, at = matches[i][0], matches[i][1]
            i += 1
            if at < pos:
                continue
            if nid in dead:
                self.skipped += 1
                continue
            start = max(block.rfind(b"\n", pos, at) + 1, pos)
            nl = block.find(b"\n", at)
            end = n if nl < 0 else nl
            found = {needles[nid]}
            while i < nm and matches[i][1] < end:
                if matches[i][0] not in dead:
                    found.add(needles[matches[i][0]])
                i += 1
            pos = take(pos, start, end, found)
            if self._dead_stale:
                dead = self.dead_now()
            if pos < n and self.lacking:
                self.build()
                needles, dead = self.needles, self.dead
                window = REFIND_WINDOW
                searched = _window_end(block, pos, window)
                matches, i = self.find(block, pos, searched), 0
                nm = len(matches)

    def live(self, needle: str) -> bool:
        """Does this needle still lead to something (a structure needle always does)?"""
        hs = self.by_needle.get(needle)
        return not hs or any(id(h) not in self.retired for h in hs)

    def dead_now(self) -> frozenset[int]:
        """The index's needles that lead nowhere with the handlers retired now (only those of
        handlers retired since it was built can), shared by the sessions in the same state."""
        key = (self._index_key, self._retired_now())
        dead = self._dead_by_state.get(key)
        if dead is None:
            # retiring only adds dead needles: those of the handlers retired since the last
            # answer are asked, not all since the build (an engine's decision retires hundreds,
            # a few at a time); a revival starts the count afresh
            ids, since = self._ids, self._since_build
            new = since[self._dead_upto :] if self._dead_upto >= 0 else since
            base = self.dead if self._dead_upto >= 0 else frozenset()
            dead = base.union(ids[n] for h in new for n in h.needles if n in ids and not self.live(n))
            kept(self._dead_by_state, key, dead, 64)
        self.dead, self._dead_stale, self._dead_upto = dead, False, len(self._since_build)
        return dead

    def handlers(self, found: set[str]) -> list[Any]:
        """The live rules and markers of these needles, in their file order (the same needles
        are asked again and again while the retired handlers stay the same: kept till then)."""
        key = frozenset(found)
        out = self._handlers_of.get(key)
        if out is None:
            out = kept(self._handlers_of, key, self._live_handlers(found), HANDLER_SETS_KEPT)
        return out

    def _live_handlers(self, found: set[str]) -> list[Any]:
        out: list[Any] = []
        seen: set[int] = set()
        for needle in found:
            for h in self.by_needle.get(needle, ()):
                if id(h) not in seen and id(h) not in self.retired:
                    seen.add(id(h))
                    out.append(h)
        out.sort(key=lambda h: self._order[id(h)])
        return out

    # --- retiring --------------------------------------------------------------------------

    def retire(self, handler: Any) -> None:
        if id(handler) in self.retired:
            return
        self.retired.add(id(handler))
        self._retired_more([handler])
        self.track.update(_tracks(handler))

    def _retired_more(self, handlers: list[Any]) -> None:
        """What retiring these changes: the index key, its staleness, the needles now dead."""
        self._retired_key = None
        self._handlers_of.clear()
        self.dirty = True
        self._since_build += handlers
        self._dead_stale = True  # each_line asks again before its next match

    def retire_phase(self, phase: str) -> None:
        """The markers of a phase just reached (a dict, not a scan of every marker: a restart
        loop reaches every phase once a run)."""
        for m in self._phase_markers.get(phase, ()):
            self.retire(m)

    def retire_markers(self, key: Hashable, pred: Callable[[Marker], bool]) -> None:
        """Retire the markers `pred` picks; `key` names that choice (the markers an engine's
        decision retires are worked out once a process, not once a stream: hundreds of them)."""
        group = self._groups.get(key)
        if group is None:
            chosen = {id(m): m for m in self.markers if pred(m)}
            # the ready/serving markers among them, still followed a block at a time (see retire)
            tracked = {i: t for i, m in chosen.items() if (t := _tracks(m))}
            group = self._groups[key] = (chosen, tracked)
        chosen, tracked = group
        new = chosen.keys() - self.retired
        if not new:
            return
        self.retired.update(new)
        self._retired_more([chosen[i] for i in new])
        for i, needles in tracked.items():  # in the markers' order, as retire() one by one
            if i in new:
                self.track.update(needles)

    def revive_phases(self) -> None:
        """A restart: the phase markers (and one-time observations) are needed again."""
        self._handlers_of.clear()
        for m in self.markers:
            if m.what in ("phases", "observe") and id(m) in self.retired:
                self.retired.discard(id(m))
                self._dead_stale = True
                self._dead_upto = -1  # needles it had dead may lead somewhere again
                self._retired_key = None
                self.dirty = True
                self.lacking = True  # the next line may already be the new run's: rebuild now
        self.track = {}

    # --- what a block says without its lines being decoded -----------------------------------

    def keep_latest_observed(self, block: bytes, last: int) -> None:
        """The latest stats line of each kind in the block: its bytes, read when a result is
        asked for (only the latest matters). `last`: the line number of the block's last newline
        (a line near the end is numbered by counting the few newlines after it)."""
        n = len(block)
        for needle in self._observe_live:
            idx = block.rfind(needle.encode("utf-8"))
            if idx >= 0:
                start = block.rfind(b"\n", 0, idx) + 1
                nl = block.find(b"\n", idx)
                line = last - block.count(b"\n", start) + 1
                self.latest_observed[frozenset({needle})] = (line, block[start : n if nl < 0 else nl])

    def progress(self, block: bytes, last_nl: int, phase_last_line: dict[str, int]) -> None:
        """The last line of the block that says ready or serving (markers retired long ago);
        `last_nl`: the line number of the block's last newline."""
        by_phase: dict[str, list[bytes]] = {}
        for needle, phase in self.track.items():
            by_phase.setdefault(phase, []).append(needle)
        for phase, needles in by_phase.items():
            idx = self._last_of(block, needles)
            if idx >= 0:
                line = last_nl - block.count(b"\n", idx) + 1
                if line > phase_last_line.get(phase, 0):
                    phase_last_line[phase] = line

    def _last_of(self, block: bytes, needles: list[bytes]) -> int:
        """Where the last of these needles starts in the block (-1: none). Few needles: an rfind
        each. More: one index over them, searched from the block's end a window at a time,
        doubling: a serving log's request lines are in the last few KiB, and only an absent
        phase costs a pass over the whole block."""
        if len(needles) < TRACK_AUTOMATON_FROM:
            return max(block.rfind(x) for x in needles)
        key = tuple(needles)
        index = self._track_indexes.get(key)
        if index is None:
            index = kept(self._track_indexes, key, make_index(needles, blocks=True), BUILT_KEPT)
        hi, size = len(block), TRACK_WINDOW
        while hi > 0:
            lo = block.rfind(b"\n", 0, max(hi - size, 0)) + 1  # a line's start: no needle is cut
            matches = index.find(block[lo:hi])
            if matches:
                return lo + max(m[1] for m in matches)
            hi, size = lo, size * 2
        return -1
