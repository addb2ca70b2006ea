"""One pass over the log: prefilter, rule and marker matching, tracebacks, timeline.

Blocks of whole lines are searched with one compiled alternation of every literal needle
(rules, phase markers, engine detection, traceback shapes); only candidate lines are
decoded, split and matched against the patterns of the rules whose needles they hold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..knowledge.engine_profiles import Marker, Profiles
from ..knowledge.rules import Rule, RuleSet
from ..model.records import Hit, Line, PhaseMark, TracebackEvent
from ..model.typed_facts import typed_facts
from ..read.nearest_time import NearestClock
from ..read.sources import decode
from .candidates import Candidates, decoded_unless_silent
from .hitbook import HitBook, RecordedHit
from .server_state import ServerState
from .serving_series import SeriesSampler, series_needles
from .tracebacks import QUIET_LEVELS, TRACEBACK_START, ErrorLines, Tracebacks, Vocabulary, echoes_code

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

_STOP_REQUESTED = Rule(
    id="run.stop-requested",
    engines=["any"],
    cls="stop",
    severity="info",
    needles=[],
    pattern="",
    title="The server was stopped on purpose: diagnose run forwarded the signal to it",
    examples_match=[],
    examples_no_match=[],
    path="(diagnose run)",
)
TRACEBACK_STALE = 64  # lines after a traceback's last frame by which its exception line has come
_EXC_RE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Fault|Failure|Timeout|Died)|Exception)"
    r"(?:\([^)]*\))?(?::(?:\s.*)?)?\s*$"
)
# A line with no level that reads as an error (C/C++ and Go engines print errors bare).
_ERROR_SHAPED = re.compile(
    r"(?i)\b(?:error|errors|failed|failure|fatal|unable to|cannot|can't|could not|couldn't|abort(?:ed|ing)?|"
    r"exceeds?|exceeded|panic|not supported|unsupported|invalid|must be|not found|out of memory)\b"
)
# a level word inside the message: "… NCCL INFO NET/Plugin: … cannot open …" is information
_OWN_QUIET_LEVEL = re.compile(r"\b(?:INFO|DEBUG|TRACE|WARN|WARNING)\b|\[[IWD]\]|level=(?:INFO|DEBUG|WARN)")
UNEXPLAINED_EXCEPTION = "An exception no rule explains"
CUT_TRACEBACK = "A traceback cut before its exception line"
CLOSING_TAIL = 5  # an unexplained ERROR line this close to the end of a startup log is its failure
CONTEXT_LINES = 60  # how far a phase marker after an error still tells its phase
RULE_EVIDENCE_WEIGHT = 3


@dataclass(slots=True)
class ScanResult:
    """What one scan saw, for the stages of a diagnosis."""

    hits: list[RecordedHit]
    hit_counts: dict[str, int]
    timeline: list[PhaseMark]
    earlier_runs: int
    engine_scores: dict[str, int]
    engine_reason: dict[str, str]
    own_engines: list[str]  # engines whose own entry point spoke: two are two servers in one log
    variant_scores: dict[str, int]
    version: str | None
    launch: dict[str, Any]
    lines: int
    last_time: str | None
    unmatched_errors: int
    unmatched_examples: list[Line] = field(default_factory=list)
    rule_lines: dict[str, list[int]] = field(default_factory=dict)
    phase_last_line: dict[str, int] = field(default_factory=dict)
    run_start_line: int = 0
    observed: dict[str, Any] = field(default_factory=dict)
    observed_where: dict[str, tuple[int, str]] = field(default_factory=dict)
    # what the engine had reported by the end of each earlier run (a restart starts a new one),
    # with the line each later run started at: advice on an earlier run's failure reads its own
    observed_before: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    rule_runs: dict[str, int] = field(default_factory=dict)  # in how many runs each rule hit
    series: list[tuple[str, int, bytes]] = field(default_factory=list)  # sampled stats lines
    series_seen: int = 0  # stats lines in the run
    # the sampled lines already read as points, kept by the scan between diagnoses (a live
    # session asks again and again; each line is read once)
    series_read: dict[Any, Any] = field(default_factory=dict)


def paste_indent(block: bytes, sample: int = 40) -> bytes:
    """The indentation every one of a log's first lines shares, when it is a paste's (four
    spaces or a tab, as markdown code blocks indent): b"" otherwise. A traceback's own
    two-space frames are not it."""
    lines = [x for x in block.split(b"\n", sample)[:sample] if x.strip()]
    if len(lines) < 3:
        return b""
    return next((ws for ws in (b"\t", b"    ") if all(x.startswith(ws) for x in lines)), b"")


def unexplained_title(line: Line, has_words: bool) -> str | None:
    """What an error line no rule and no traceback explains is, when it is one worth a finding."""
    if line.level == "CRITICAL":
        return "A critical error no rule explains"
    msg = line.message
    if line.level is None and ": " in msg and _EXC_RE.match(msg):
        # Python's own last line of a traceback, printed bare (the traceback above it cut or
        # never printed: `print(e)`, a launcher relaying its child's error): an error line
        return UNEXPLAINED_EXCEPTION
    if has_words and (
        line.level == "ERROR"
        or (line.level is None and _ERROR_SHAPED.search(msg) and not _OWN_QUIET_LEVEL.search(msg[:100]))
    ):
        # an error line no rule explains, in a class's own words: the vocabulary names it
        return "An error line no rule explains"
    return None


class Scanner:
    """One scan: feeds blocks, decodes the candidate lines, and keeps what they say."""

    def __init__(
        self, ruleset: RuleSet, profiles: Profiles, engine: str | None = None, keep_rule_lines: bool = False
    ):
        self.rules = ruleset.rules
        self.profiles = profiles
        self.candidates = Candidates(self.rules, profiles)
        self.server = ServerState(profiles, self.candidates, engine)
        self.book = HitBook(keep_rule_lines)
        self.tbs = Tracebacks()
        self.words = Vocabulary()
        self._series_needles = series_needles(profiles)  # periodic stats lines: the serving series
        self.series = SeriesSampler()
        self.layout = profiles.layout.fresh()  # the wrappers this scan learns are its own
        self.source = "-"
        self.lineno = 0
        self.last_time: str | None = None
        self._linenos: dict[str, int] = {}
        # a log pasted as a markdown code block: every line indented the same (per source)
        self._indents: dict[str, bytes] = {}
        self._indent = b""
        self._block = b""  # the block being fed, and where the current line starts in it
        self._line_start = 0
        self.clock = NearestClock(self.layout)  # the time of a line that prints none
        self._want_progress = False  # an unexplained error wants to know if serving went on
        self.pending_context: list[RecordedHit] = []  # hits before any phase, waiting for one
        self.errors = ErrorLines()  # the ERROR lines nothing explained

    # --- feeding ------------------------------------------------------------------

    def set_source(self, name: str) -> None:
        """Lines now come from this source (merged logs switch back and forth): its own count."""
        self._linenos[self.source] = self.lineno
        self.source = name
        self.lineno = self._linenos.get(name, 0)

    def _now(self, line: Line) -> str | None:
        """When this line was written: its own time, else that of the nearest line before it
        that carries one."""
        if line.timestamp:
            return line.timestamp
        return self.clock.before(self._line_start) or self.last_time

    def feed(self, block: bytes) -> None:
        """Process one block of whole lines: only lines holding a live needle are decoded."""
        if self.source not in self._indents:
            self._indents[self.source] = paste_indent(block)
        self._indent = self._indents[self.source]
        if self.candidates.stale():
            self.candidates.build()
        base = self.lineno  # lines before this block
        self.clock.start(block, self.source, self.last_time)
        pos = self._candidate_lines(block)
        n = len(block)
        if pos < n:
            self.lineno += block.count(b"\n", pos, n)
            if not block.endswith(b"\n"):
                self.lineno += 1
        # the clock at the block's end, found as a line's is (not dependent on where blocks end)
        t = self.clock.before(n)
        if t is not None:
            self.last_time = t
        self._block = b""
        self.clock.done()
        last = self.lineno - (not block.endswith(b"\n"))  # the line of the block's last newline
        self.candidates.keep_latest_observed(block, last)
        if self._series_needles:
            self.series.collect(block, base, self.source, self._series_needles)
        if self._want_progress:
            self.candidates.progress(block, last, self.server.phase_last_line)

    def _candidate_lines(self, block: bytes) -> int:
        """Process the lines of the block that hold a needle; the first byte not yet counted."""
        return self.candidates.each_line(block, lambda *at: self._take_line(block, *at))

    def _take_line(self, block: bytes, pos: int, start: int, end: int, found: set[str]) -> int:
        """One candidate line (and the lines of a launch dump it opens); the next byte to read."""
        n = len(block)
        self.lineno += block.count(b"\n", pos, start) + 1
        self._block, self._line_start = block, start
        self._process(block[start:end], found)
        pos = end + 1
        while self.server.collecting is not None and pos < n:  # a launch dump's next lines
            nl = block.find(b"\n", pos)
            end = n if nl < 0 else nl
            self.lineno += 1
            self._process(block[pos:end], set())
            pos = end + 1
        return pos

    # --- one candidate line -------------------------------------------------------------

    def _process(self, raw: bytes, found: set[str]) -> None:
        if self._indent and raw.startswith(self._indent):
            raw = raw[len(self._indent) :]
        for stream, tb in self.tbs.stale(self.source, self.lineno, TRACEBACK_STALE) if self.tbs.open else ():
            self._close_tb(stream, tb)
        handlers = self.candidates.handlers(found)
        if found and not self.tbs.open and self.server.collecting is None:
            got = decoded_unless_silent(found, handlers, raw)
            if got is None:
                return  # nothing to read on this line (candidates.says_nothing), nothing open around it
            text, truncated = got
        else:
            text, truncated = decode(raw)
        line = self.layout.split(Line(source=self.source, number=self.lineno, text=text, truncated=truncated))
        if line.timestamp:
            self.last_time = line.timestamp
        if self.server.collecting is not None:
            self.server.collect(line)
            return
        msg = line.message
        tb, frame = self._traceback_shape(line)
        closing = tb is not None and not frame and TRACEBACK_START not in msg and bool(_EXC_RE.match(msg))
        if closing and tb is not None:
            tb.exception = line
        # outside a traceback, a quiet line's words are never kept (see _vocab): not even searched
        may_have_words = not (tb is None and line.level in QUIET_LEVELS) and not frame
        matched_rule, vocab = self._handle(handlers, line, tb, may_have_words)
        words: list[tuple[Rule, str]] = []  # vocabulary terms on this line
        for h in vocab if not matched_rule else ():
            m = h.search(msg if h.scope == "message" else line.text)
            if m is not None:
                words.append((h, m.group(0)))
        if not matched_rule:  # a line a specific rule explained is that rule's finding already
            for h, term in words:
                self.words.word(h, line, tb, term)
        if closing and tb is not None:
            self._close_tb(line.stream, tb)
        if not (matched_rule or tb is not None or frame or not msg.strip() or msg.startswith((" ", "\t"))):
            self._unexplained(line, bool(words))

    def stop_requested(self, why: str) -> None:
        """The server is being stopped on purpose from here on (`run` forwarded a Ctrl-C): what
        it prints while it tears down is part of the stop (triage quiets it), whichever of its
        processes speaks first."""
        line = Line(source=self.source, number=self.lineno + 1, text=why)
        line.message = why
        self._record(_STOP_REQUESTED, line, {}, None, self.last_time)

    def _traceback_shape(self, line: Line) -> tuple[TracebackEvent | None, re.Match[str] | None]:
        """The traceback this line opens, continues or belongs to, and its frame (first, so
        hits on this line know their traceback)."""
        tb = self.tbs.open.get(line.stream)
        if tb is not None and TRACEBACK_START in line.message:
            self._close_tb(line.stream, tb)  # a new one starts: the last one ended unexplained
        tb, frame = self.tbs.shape(line, self.lineno)
        if tb is not None and tb.start is line:
            tb.when = self._now(line)
        return tb, frame

    def _handle(
        self, handlers: list[Any], line: Line, tb: TracebackEvent | None, may_have_words: bool
    ) -> tuple[bool, list[Rule]]:
        """Markers and rules on the line, in order; whether a rule matched, and the vocabulary
        rules left to search (after the rules, only where a word can count: compiling a class's
        words costs milliseconds)."""
        engine = self.server.active_engine()
        matched_rule = False
        vocab: list[Rule] = []
        for h in handlers:
            if isinstance(h, Marker):
                phase = self.server.marker(h, line, engine)
                if phase is not None:
                    self._phase(phase, line)
                continue
            if h.layer == "vocabulary":
                if may_have_words:
                    vocab.append(h)
                continue
            m = h.search(line.message if h.scope == "message" else line.text)
            if m is None:
                continue
            matched_rule = True
            if echoes_code(tb, line):
                # the source a frame echoes; the exception line after it says the same
                tb.explained = True  # type: ignore[union-attr]
                # recorded when the traceback closes (maybe after its block): its time is taken now
                tb.echoed.append((h, line, typed_facts(m.groupdict()), self._now(line)))  # type: ignore[union-attr]
                continue
            self._record(h, line, typed_facts(m.groupdict()), tb)
            if len(h.engines) == 1 and h.engines[0] not in ("any", "generic"):
                # a message only one engine prints is evidence of that engine
                self.server.evidence(h.engines[0], RULE_EVIDENCE_WEIGHT, line)
        return matched_rule, vocab

    def _unexplained(self, line: Line, has_words: bool) -> None:
        """An error line no rule and no traceback explains: counted, and a finding when it is one."""
        title = unexplained_title(line, has_words)
        self.errors.note(line, exception_shaped=title == UNEXPLAINED_EXCEPTION)
        if title is not None:
            self._synthetic(line, title)

    # --- hits ---------------------------------------------------------------------------

    def _recorded(
        self, rid: str, rule: Rule | None, line: Line, facts: dict[str, Any], **kw: Any
    ) -> RecordedHit:
        s = self.server
        rec = RecordedHit(Hit(rid, line, facts), rule, s.run, s.current_phase, frozenset(s.reached), **kw)
        self.book.keep(rid, rec)
        if not s.reached:
            self.pending_context.append(rec)
        return rec

    def _record(
        self,
        rule: Rule,
        line: Line,
        facts: dict[str, Any],
        tb: TracebackEvent | None,
        when: str | None = None,
    ) -> None:
        self.book.count(rule.id, line.number)
        if tb is not None:
            tb.explained = True
        rec = self._recorded(rule.id, rule, line, facts, last_time=when or self._now(line), tb=tb)
        if rule.cls == "unknown_error":
            self.words.take(rec, tb.start if tb is not None else line)
        self.tbs.hit(rec, tb)

    def _synthetic(self, line: Line, title: str, tb: TracebackEvent | None = None) -> None:
        rid = "generic.unexplained-error"
        self._want_progress = True
        self.book.count(rid)
        if line.number == self.lineno and self._block:
            when = self._now(line)  # the line being read
        else:  # a traceback's start, closed later
            when = tb.when if tb is not None and tb.start is line else None
        rec = self._recorded(
            rid, None, line, {}, last_time=when or self.last_time, tb=tb, synthetic_title=title
        )
        self.words.take(rec, tb.start if tb is not None else line)

    def _close_tb(self, stream: str, tb: TracebackEvent) -> None:
        hit_rules = self.tbs.closing(stream, tb)
        for rule, echo_line, facts, when in tb.echoed:
            if rule.id not in hit_rules:  # the exception line did not say it: the code did
                hit_rules.add(rule.id)
                self._record(rule, echo_line, facts, tb, when)
        if not tb.explained:
            title = UNEXPLAINED_EXCEPTION if tb.exception else CUT_TRACEBACK
            self._synthetic(tb.exception or self.errors.header_of(tb.start) or tb.start, title, tb)
        self.tbs.forget(tb)

    # --- phases ---------------------------------------------------------------------------

    def _phase(self, phase: str, line: Line) -> None:
        s = self.server
        if s.restarts(phase):  # the server started again: a new run begins
            self.apply_observed()
            s.new_run(line.number)
            self.series = SeriesSampler()  # the serving series of the new run
        # a line without its own time (uvicorn's) happened at the last time the log showed
        if s.reach(phase, line, lambda: self._now(line)) and self.pending_context:
            for rec in self.pending_context:
                if line.number - rec.hit.line.number <= CONTEXT_LINES and line.source == rec.hit.line.source:
                    rec.phase_after = phase
            self.pending_context = []

    # --- end ----------------------------------------------------------------------------

    def apply_observed(self) -> None:
        """Read the stats lines kept as bytes (only the latest of each kind matters)."""
        self.server.read_observed(self.layout, self.source)

    def finish(self) -> ScanResult:
        """The log has ended: close what is open and hand over the result."""
        self.apply_observed()
        for stream, tb in list(self.tbs.open.items()):
            self._close_tb(stream, tb)
        # a startup whose log ends on an ERROR line no rule or word explains (a config check that
        # refuses a value, a launcher's last word) failed there, not an 'incomplete' log
        last = self.errors.closing(
            self.source, self.lineno, CLOSING_TAIL, self.server.reached, self.book.kept()
        )
        if last is not None:
            self._synthetic(last, "The startup ends on an error no rule explains")
        return self.snapshot()

    def snapshot(self) -> ScanResult:
        """The result so far, without ending anything (for live diagnosis)."""
        self.apply_observed()
        return ScanResult(
            **self.server.result_fields(),
            **self.book.result_fields(),
            lines=self.lineno,
            last_time=self.last_time,
            unmatched_errors=self.errors.count,
            unmatched_examples=self.errors.examples,
            series=self.series.snapshot(),
            series_seen=self.series.seen,
            series_read=self.series.read,
        )
