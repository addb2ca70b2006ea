"""The time of a line that prints none: that of the nearest line before it that does.

Most lines of a log are never decoded, so "the last time read" is the time of whichever line
happened to be a candidate: a traceback's exception line would take a clock from minutes
earlier. These search the raw block backwards instead, splitting only lines that hold a
clock's digits.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from .prefixes import Layout

# every timestamp layout holds hours and minutes, `\d\d:\d\d`: written from its colon, whose
# literal `re` skips to (27x faster on prose than trying a digit at every byte); a search
# from `lo + 2` finds exactly the clocks that begin at `lo` or after
_CLOCK = re.compile(rb":(?<=\d\d:)\d\d")
CLOCK_CHUNK = 8 << 10  # bytes searched back at a time for a line with a clock
CLOCK_TRIES = 16  # lines with a clock's digits tried before taking the block's earlier time
LINE_BY_LINE = 4  # lines searched one at a time before the rest of a window in one pass
HEAD_BYTES = 300  # a line's first bytes, where its prefix layers and their time are


def time_before(layout: Layout, source: str, block: bytes, end: int, lines: int = 5) -> str | None:
    """The timestamp of the nearest of the few lines before `end` that carries one."""
    for _ in range(lines):
        if end <= 0:
            return None
        start = block.rfind(b"\n", 0, end - 1) + 1
        raw = block[start:end].rstrip(b"\n")
        if raw:
            ts = layout.line(source, 0, raw[:HEAD_BYTES]).timestamp
            if ts:
                return ts
        end = start
    return None


class NearestClock:
    """The nearest time before a position of the block being read. Lines ask in order, so
    each stretch of the block is searched once, backwards from the asking line."""

    __slots__ = ("_block", "_searched", "_time", "layout", "source")

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.source = "-"
        self._block = b""
        self._searched = 0
        self._time: str | None = None

    def start(self, block: bytes, source: str, before: str | None) -> None:
        """A new block of `source`, whose lines come after the time `before`."""
        self._block, self.source, self._searched, self._time = block, source, 0, before

    def before(self, end: int) -> str | None:
        block = self._block
        if not block:
            return None
        if end < self._searched:
            return time_before(self.layout, self.source, block, end)
        tries = 0
        hi = end
        while hi > self._searched and tries < CLOCK_TRIES:
            lo = max(self._searched, hi - CLOCK_CHUNK)
            for start in self._clock_lines(block, lo, hi):
                # a line's first HEAD_BYTES hold its stamp: a 200 KB request dump is not copied
                stop = min(end, start + HEAD_BYTES)
                nl = block.find(b"\n", start, stop)
                raw = block[start : stop if nl < 0 else nl]
                ts = self.layout.line(self.source, 0, raw).timestamp if raw else None
                if ts:
                    self._searched, self._time = end, ts
                    return ts
                tries += 1
                if tries >= CLOCK_TRIES:
                    break
            hi = lo
        self._searched = end
        return self._time

    @staticmethod
    def _clock_lines(block: bytes, lo: int, hi: int) -> Iterator[int]:
        """The starts of the lines of block[lo:hi] that hold a clock's digits (in the window),
        nearest first. The last few lines one by one (a stamped log's last line has its clock);
        past them, the rest of the window in one search (a traceback's lines have none)."""
        search = _CLOCK.search
        pos = hi
        for _ in range(LINE_BY_LINE):
            if pos <= lo:
                return
            nl = block.rfind(b"\n", lo, pos - 1)
            if nl < 0:  # a line begun before the window (found only if yielded: it may be long)
                if search(block, lo + 2, pos) is not None:
                    yield block.rfind(b"\n", 0, lo) + 1
                return
            start = nl + 1
            if search(block, start + 2, pos) is not None:
                yield start
            pos = start
        size, last = 1024, -1
        while pos > lo:  # the rest a stretch at a time, from its end, each twice the last
            cut = max(lo, block.rfind(b"\n", lo, pos - size) + 1) if pos - size > lo else lo
            starts = _line_starts(block, [m.start() for m in _CLOCK.finditer(block, cut + 2, pos)])
            for start in reversed(starts):
                if start != last:
                    yield start
                    last = start
            pos, size = cut, size * 2

    def done(self) -> None:
        self._block = b""


def _line_starts(block: bytes, offsets: list[int]) -> list[int]:
    """The start of the line of each offset (ascending): each found from the last, so the
    offsets of one long line do not each search back to its start."""
    out: list[int] = []
    prev = start = 0
    for at in offsets:
        nl = block.rfind(b"\n", prev, at)
        if nl >= 0 or not out:
            start = nl + 1
        out.append(start)
        prev = at
    return out
