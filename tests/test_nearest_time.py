"""The nearest clock before a line (read/nearest_time.py): the lines it tries, nearest first,
are those a plain reading of the window gives, on real log bytes and on generated blocks with
long lines; a long line is neither searched back to its start per window nor copied."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.knowledge.loaded import Knowledge
from diagnose.read import nearest_time
from diagnose.read.nearest_time import NearestClock, _line_starts

ROOT = Path(__file__).resolve().parent.parent
_CLOCK = re.compile(rb"\d\d:\d\d")


def _plain_clock_lines(block: bytes, lo: int, hi: int) -> Iterator[int]:
    """The reading the module's docstring describes, without its shortcuts: the last lines one
    by one (each searched within the window), then every clock of the rest, a stretch at a
    time from the end, as its line's start."""
    pos = hi
    for _ in range(nearest_time.LINE_BY_LINE):
        if pos <= lo:
            return
        start = block.rfind(b"\n", 0, pos - 1) + 1
        if _CLOCK.search(block, max(start, lo), pos) is not None:
            yield start
        pos = start
    size, last = 1024, -1
    while pos > lo:
        cut = max(lo, block.rfind(b"\n", lo, pos - size) + 1) if pos - size > lo else lo
        starts = [block.rfind(b"\n", 0, m.start()) + 1 for m in _CLOCK.finditer(block, cut, pos)]
        for start in reversed(starts):
            if start != last:
                yield start
                last = start
        pos, size = cut, size * 2


def _windows(block: bytes) -> Iterator[tuple[int, int]]:
    rng = random.Random(len(block))
    for _ in range(40):
        hi = rng.randrange(1, len(block) + 1)
        yield max(0, hi - rng.choice([64, 1000, nearest_time.CLOCK_CHUNK])), hi


def test_the_lines_tried_are_the_plain_readings_on_real_logs() -> None:
    checked = 0
    for p in sorted((ROOT / "fixtures" / "logs").glob("*/*.log"))[:40]:
        block = p.read_bytes()
        for lo, hi in _windows(block):
            assert list(NearestClock._clock_lines(block, lo, hi)) == list(_plain_clock_lines(block, lo, hi))
            checked += 1
    assert checked >= 1_000


_LINE = st.one_of(
    st.sampled_from(
        [
            b"",
            b"12:34",
            b"INFO 01-02 10:11:12 [x.py:1] ok",
            b"  File x",
            b"9:5 no",
            b"12:345:67",
            b"1:23",
            b":12",
            b"12:",
        ]
    ),
    st.builds(lambda n, c: (b"a" * n) + (b" 10:20 " if c else b""), st.integers(0, 20_000), st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_LINE, min_size=1, max_size=12), st.integers(0, 10**6), st.integers(0, 10**6))
def test_the_lines_tried_are_the_plain_readings_with_long_lines(lines, a, b) -> None:  # type: ignore[no-untyped-def]
    block = b"\n".join(lines) + b"\n"
    hi = 1 + a % len(block)
    lo = max(0, hi - 1 - b % (2 * nearest_time.CLOCK_CHUNK))
    assert list(NearestClock._clock_lines(block, lo, hi)) == list(_plain_clock_lines(block, lo, hi))
    offsets = sorted({m.start() for m in _CLOCK.finditer(block)})
    assert _line_starts(block, offsets) == [block.rfind(b"\n", 0, at) + 1 for at in offsets]


def test_a_long_lines_time_is_read_from_its_head() -> None:
    """A 200 KB stamped request dump after a stamped line: its own time, read from its first
    bytes; past a dump without one (nor a clock's digits), the line before it; past one whose
    every window holds a clock's digits, the tries run out (CLOCK_TRIES) as they did."""
    layout = Knowledge.load().profiles.layout.fresh()
    dump = b"[2026-02-09 14:45:26] Finish: obj=GenerateReqInput(text='" + b"word 12:00 " * 20_000 + b"')"
    block = b"[2026-02-09 14:45:20] Prefill batch. #new-seq: 1\n" + dump + b"\nnext line\n"
    clock = NearestClock(layout)
    clock.start(block, "s", None)
    assert clock.before(len(block) - len(b"next line\n")) == "2026-02-09 14:45:26"
    clock.start(block.replace(b"[2026-02-09 14:45:26] ", b""), "s", None)
    assert clock.before(len(block) - 30) is None
    quiet = block.replace(b"[2026-02-09 14:45:26] ", b"").replace(b" 12:00", b" 1200.")
    clock.start(quiet, "s", None)
    assert clock.before(len(quiet) - 30) == "2026-02-09 14:45:20"
