"""Tracebacks and the words around errors, as one scan meets them: which traceback is open on
each stream, which hits belong to it, and the vocabulary terms near an error no rule explains."""

from __future__ import annotations

import re
from collections import defaultdict

from ..knowledge.rules import Rule
from ..model.records import Line, TracebackEvent, VocabHit
from .hitbook import RecordedHit

TRACEBACK_START = "Traceback (most recent call last)"
FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+, in (?P<func>[\w<>.]+)')
MAX_FRAMES = 96
MAX_VOCAB = 16  # vocabulary terms kept per traceback or unexplained error
VOCAB_AFTER = 40  # lines after an unexplained error whose words still describe it (multi-line messages)
VOCAB_BEFORE = 30  # lines before it (a tool's stderr printed ahead of the traceback)
QUIET_LEVELS = ("INFO", "DEBUG", "WARNING")


def echoes_code(tb: TracebackEvent | None, line: Line) -> bool:
    """Is this the source line a traceback frame echoes (indented, right after its frame)?"""
    return tb is not None and line.number == tb.last_frame + 1 and line.message.startswith((" ", "\t"))


class Tracebacks:
    def __init__(self) -> None:
        self.open: dict[str, TracebackEvent] = {}  # stream -> its open traceback
        self.hits: dict[int, list[RecordedHit]] = defaultdict(list)  # id(traceback) -> its hits
        self.last_hit_by_stream: dict[str, RecordedHit] = {}
        self.recent_untraced: list[RecordedHit] = []  # hits still looking for a nearby traceback

    def opened(self, stream: str, line: Line) -> TracebackEvent:
        tb = TracebackEvent(stream=stream, start=line, exception=None, frames=[])
        # the error line just before a traceback is usually its summary ("EngineCore failed")
        prev = self.last_hit_by_stream.get(stream)
        if (
            prev is not None
            and line.number - prev.hit.line.number <= 3
            and prev.hit.line.source == line.source
        ):
            if prev.tb is None:
                prev.tb = tb
                self.hits[id(tb)].append(prev)
            if prev.rule is not None:
                tb.explained = True
        for rec in self.recent_untraced:
            if rec.tb is None and rec.near_tb is None and 0 <= line.number - rec.hit.line.number <= 5:
                rec.near_tb = tb
        self.recent_untraced = []
        self.open[stream] = tb
        return tb

    def shape(self, line: Line, lineno: int) -> tuple[TracebackEvent | None, re.Match[str] | None]:
        """The traceback this line opens or continues (its open one, else None), and the frame
        it is, if one."""
        stream, msg = line.stream, line.message
        frame = FRAME_RE.match(msg)
        if TRACEBACK_START in msg:
            return self.opened(stream, line), frame
        tb = self.open.get(stream)
        if frame:
            if tb is None:
                tb = self.opened(stream, line)
            tb.last_frame = lineno
            path = frame.group("file").replace("\\", "/")  # Windows paths too
            tb.innermost_file = path.rsplit("-packages/", 1)[-1]
            if len(tb.frames) < MAX_FRAMES:
                file = path.rsplit("/", 1)[-1]
                tb.frames.append(frame.group("func"))
                tb.frames.append(file[:-3] if file.endswith(".py") else file)
        return tb, frame

    def closing(self, stream: str, tb: TracebackEvent) -> set[str]:
        """The traceback ends (its last hits may still come: `forget` it after them); the rules
        its hits already name."""
        self.open.pop(stream, None)
        return {r.rule.id for r in self.hits.get(id(tb), ()) if r.rule is not None}

    def stale(self, source: str, lineno: int, after: int) -> list[tuple[str, TracebackEvent]]:
        """The open tracebacks of `source` whose exception line never came (a format no pattern
        reads, a log cut and pasted): `after` lines past their last frame, the errors and words
        of the rest of the log are not theirs."""
        return [
            (stream, tb)
            for stream, tb in self.open.items()
            if tb.start.source == source and lineno - max(tb.last_frame, tb.start.number) > after
        ]

    def forget(self, tb: TracebackEvent) -> None:
        self.hits.pop(id(tb), None)

    def hit(self, rec: RecordedHit, tb: TracebackEvent | None) -> None:
        if tb is not None:
            self.hits[id(tb)].append(rec)
        self.last_hit_by_stream[rec.hit.line.stream] = rec
        if tb is None:
            self.recent_untraced.append(rec)
            if len(self.recent_untraced) > 8:
                del self.recent_untraced[0]


class Vocabulary:
    """A class's words near unexplained errors: kept for them, never a hit of their own."""

    def __init__(self) -> None:
        self.recent: list[VocabHit] = []  # the latest terms, for errors that follow
        self.takers: list[RecordedHit] = []  # unexplained errors still collecting words after them

    def word(self, rule: Rule, line: Line, tb: TracebackEvent | None, term: str) -> None:
        """A class's word on a line: kept for the unexplained errors around it, never a hit."""
        if echoes_code(tb, line) and not line.message.lstrip().startswith(("assert ", "raise ")):
            return  # the source line a frame echoes is code, not what happened (a failed assert is)
        if tb is None and line.level in QUIET_LEVELS:
            return  # outside a traceback, only error text counts: INFO lines name tokenizers too
        vh = VocabHit(rule.id, rule.cls or "unknown_error", rule.title, line, term[:120])
        if tb is not None and len(tb.vocab) < MAX_VOCAB:
            tb.vocab.append(vh)
        for rec in self.takers:
            gap = line.number - rec.hit.line.number
            if rec.hit.line.source == line.source and 0 <= gap <= VOCAB_AFTER and len(rec.vocab) < MAX_VOCAB:
                rec.vocab.append(vh)
        self.recent.append(vh)
        if len(self.recent) > 2 * MAX_VOCAB:
            del self.recent[0]

    def take(self, rec: RecordedHit, start: Line) -> None:
        """An unexplained error: the words just before it now, the words after it as they come."""
        rec.vocab = [
            v
            for v in self.recent
            if v.line.source == start.source and 0 <= start.number - v.line.number <= VOCAB_BEFORE
        ][-MAX_VOCAB:]
        near = [r for r in self.takers if rec.hit.line.number - r.hit.line.number <= VOCAB_AFTER]
        self.takers = [*near[-7:], rec]


class ErrorLines:
    """The ERROR lines nothing explained: counted, the first examples kept, and the latest
    (a startup that ends on one failed there)."""

    EXAMPLES = 20

    def __init__(self) -> None:
        self.count = 0
        self.examples: list[Line] = []
        self.last: Line | None = None

    def note(self, line: Line, exception_shaped: bool = False) -> None:
        if line.level in ("ERROR", "CRITICAL") or (line.level is None and exception_shaped):
            self.count += 1
            self.last = line
            if len(self.examples) < self.EXAMPLES:
                self.examples.append(line)

    def header_of(self, start: Line) -> Line | None:
        """The error line `logger.exception(msg)` printed right before a traceback from the same
        logger location (`start`: the traceback's first line): the message of a traceback cut
        before its exception line."""
        head = self.last
        if (
            head is None
            or head.source != start.source
            or not 0 < start.number - head.number <= 2
            or head.location != start.location
        ):
            return None
        return head

    def closing(
        self, source: str, lineno: int, tail: int, reached: set[str], hits: list[RecordedHit]
    ) -> Line | None:
        """The error a startup log ends on (within `tail` lines of its end), when it never got
        ready and nothing was found after it: its failure, though no rule or word names it."""
        line = self.last
        if line is None or "ready" in reached or line.source != source or lineno - line.number > tail:
            return None
        if any(r.hit.line.number >= line.number and r.hit.line.source == line.source for r in hits):
            return None
        return line
