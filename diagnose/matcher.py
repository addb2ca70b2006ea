"""One pass over the log: prefilter, rule and marker matching, tracebacks, timeline.

Blocks of whole lines are searched with one compiled alternation of every literal needle
(rules, phase markers, engine detection, traceback shapes); only candidate lines are
decoded, split and matched against the patterns of the rules whose needles they hold.
"""

from __future__ import annotations

import re
from collections import defaultdict, deque
from dataclasses import dataclass, field
from itertools import pairwise

from .engines import Marker, Profiles
from .facts import typed_facts
from .launch import canonical_launch, parse_repr
from .model import PHASE_INDEX, Hit, Line, PhaseMark, TracebackEvent, VocabHit
from .needles import make_index
from .rules import Rule, RuleSet
from .serving import SeriesSampler

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

TRACEBACK_START = "Traceback (most recent call last)"
_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+, in (?P<func>[\w<>.]+)')
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
# Needles that only shape tracebacks or count error-looking lines (no rule behind them).
STRUCTURE_NEEDLES = [
    TRACEBACK_START,
    'File "',
    "Error",
    "Exception",
    "Exit",
    "Interrupt",
    "ERROR",
    "CRITICAL",
    "FATAL",
]
# Hits kept in memory per rule: the first ones and the latest ones (a restart loop's last run
# must be seen whatever came before it); the count goes on.
FIRST_HITS_KEPT = 32
LAST_HITS_KEPT = 32
MAX_FRAMES = 96
CLOSING_TAIL = 5  # an unexplained ERROR line this close to the end of a startup log is its failure
MAX_VOCAB = 16  # vocabulary terms kept per traceback or unexplained error
VOCAB_AFTER = 40  # lines after an unexplained error whose words still describe it (multi-line messages)
QUIET_LEVELS = ("INFO", "DEBUG", "WARNING")
VOCAB_BEFORE = 30  # lines before it (a tool's stderr printed ahead of the traceback)
CONTEXT_LINES = 60  # how far a phase marker after an error still tells its phase
ENGINE_MIN_SCORE = 5
ENGINE_DECIDED = 30  # detection evidence after which other engines' markers stop being searched
VARIANT_DECIDED = 20
RULE_EVIDENCE_WEIGHT = 3
DFA_AFTER = 4 << 20  # bytes scanned before the index becomes a DFA (a long log: scanning speed wins)
# Retired needles stay in the index until they have cost this many needless candidate lines:
# then a rebuild (about a millisecond) pays for itself, and the rest of the block is searched again.
REFIND_AFTER = 64


@dataclass(slots=True)
class RecordedHit:
    hit: Hit
    rule: Rule | None  # None for a synthetic unknown-error hit
    run: int
    phase_at: str | None
    reached: frozenset[str]
    last_time: str | None
    tb: TracebackEvent | None = None
    near_tb: TracebackEvent | None = None  # another stream's traceback right after it
    phase_after: str | None = None
    synthetic_title: str | None = None
    vocab: list[VocabHit] = field(default_factory=list)  # class words near it (unexplained errors)


@dataclass(slots=True)
class ScanResult:
    hits: list[RecordedHit]
    hit_counts: dict[str, int]
    timeline: list[PhaseMark]
    earlier_runs: int
    engine_scores: dict[str, int]
    engine_reason: dict[str, str]
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


def paste_indent(block: bytes, sample: int = 40) -> bytes:
    """The indentation every one of a log's first lines shares, when it is a paste's (four
    spaces or a tab, as markdown code blocks indent): b"" otherwise. A traceback's own
    two-space frames are not it."""
    lines = [x for x in block.split(b"\n", sample)[:sample] if x.strip()]
    if len(lines) < 3:
        return b""
    return next((ws for ws in (b"\t", b"    ") if all(x.startswith(ws) for x in lines)), b"")


def _echoes_code(tb: TracebackEvent | None, line: Line) -> bool:
    """Is this the source line a traceback frame echoes (indented, right after its frame)?"""
    return tb is not None and line.number == tb.last_frame + 1 and line.message.startswith((" ", "\t"))


class Scanner:
    def __init__(
        self, ruleset: RuleSet, profiles: Profiles, engine: str | None = None, keep_rule_lines: bool = False
    ):
        self.rules = ruleset.rules
        self.profiles = profiles
        self.forced_engine = engine
        self.keep_rule_lines = keep_rule_lines
        by_needle: dict[str, list[Any]] = defaultdict(list)
        for r in self.rules:
            for n in r.needles:
                by_needle[n].append(r)
        for m in profiles.markers:
            for n in m.needles:
                by_needle[n].append(m)
        for n in STRUCTURE_NEEDLES:
            by_needle.setdefault(n, [])
        self._by_needle = dict(by_needle)
        # Needles only recurring stats lines carry (KV usage, decode batches): only the latest
        # one in a block matters, so they are found with one rfind per block, not the index.
        self._observe_only = {
            n
            for n, hs in self._by_needle.items()
            if hs and all(getattr(h, "what", "") == "observe" and getattr(h, "repeat", False) for h in hs)
        }
        self._latest_observed: dict[frozenset[str], tuple[int, bytes]] = {}
        # periodic stats lines: every one is a point of the serving series (a bounded sample)
        needles = {n.encode("utf-8") for s in profiles.series for n in s.needles}
        # a needle holding another one ("GPU KV cache usage:" and "KV cache usage:") finds no more lines
        self._series_needles = sorted(n for n in needles if not any(m != n and m in n for m in needles))
        self.series = SeriesSampler()
        self._order = {id(m): i for i, m in enumerate(profiles.markers)}
        self._order.update({id(r): 10_000 + i for i, r in enumerate(self.rules)})
        # Markers stop being searched once they can tell nothing new (a phase already
        # reached, an engine already decided): a long serving log then has few candidates.
        self._retired: set[int] = set()
        self._index_dirty = True
        self._index: Any = None
        self._index_needles: list[str] = []
        self._observe_live: list[str] = []
        self._want_progress = False
        self._fed = 0  # bytes fed so far
        self._dfa = False  # whether the index is the slow-to-build, fast-to-scan kind
        self._wasted = 0  # candidate lines since the last build that only retired needles brought
        self._lacking = False  # revived handlers whose needles the index no longer holds
        self._block = b""  # the block being fed, and where the current line starts in it
        self._line_start = 0
        self._track: dict[bytes, str] = {}  # retired ready/serving needles, tracked per block
        # state
        self.source = "-"
        self.lineno = 0
        self._linenos: dict[str, int] = {}
        self.layout = profiles.layout.fresh()  # the wrappers this scan learns are its own
        # a log pasted as a markdown code block: every line indented the same (per source)
        self._indents: dict[str, bytes] = {}
        self._indent = b""
        self.hits: list[RecordedHit] = []
        self.hit_counts: dict[str, int] = defaultdict(int)
        self._seq = 0  # order of recorded hits, for the first and the latest kept per rule
        self._hit_seq: list[int] = []
        self._tail_hits: dict[str, deque[tuple[int, RecordedHit]]] = {}
        self.rule_runs: dict[str, int] = defaultdict(int)
        self._rule_last_run: dict[str, int] = {}
        self.timeline: list[PhaseMark] = []
        self.reached: set[str] = set()
        self.current_phase: str | None = None
        self.run = 0
        self.engine_scores: dict[str, int] = defaultdict(int)
        self.engine_reason: dict[str, str] = {}
        self._reason_weight: dict[str, int] = {}
        self.variant_scores: dict[str, int] = defaultdict(int)
        self.version: str | None = None
        self.version_engine: str | None = None
        self.launch_raw: dict[str, dict[str, Any]] = defaultdict(dict)
        self.observed: dict[str, Any] = {}
        self.observed_where: dict[str, tuple[int, str]] = {}  # the line each value was last read from
        self.last_time: str | None = None
        self.open_tbs: dict[str, TracebackEvent] = {}
        self.tb_hits: dict[int, list[RecordedHit]] = defaultdict(list)
        self.last_hit_by_stream: dict[str, RecordedHit] = {}
        self.pending_context: list[RecordedHit] = []
        self.recent_untraced: list[RecordedHit] = []  # hits still looking for a nearby traceback
        self.last_unmatched_error: Line | None = None  # the latest ERROR line nothing explained
        self.recent_vocab: list[VocabHit] = []  # the latest vocabulary terms, for errors that follow
        self.vocab_takers: list[RecordedHit] = []  # unexplained errors still collecting words after them
        self.phase_last_line: dict[str, int] = {}
        self.run_start_line = 0
        self.observed_before: list[tuple[int, dict[str, Any]]] = []
        self.unmatched_errors = 0
        self.unmatched_examples: list[Line] = []
        self.rule_lines: dict[str, list[int]] = defaultdict(list)
        self._collect: tuple[Marker, list[str], int] | None = None  # multi-line launch dump

    # --- feeding ------------------------------------------------------------------

    def set_source(self, name: str) -> None:
        """Lines now come from this source; each source keeps its own line count (merged
        logs switch back and forth)."""
        self._linenos[self.source] = self.lineno
        self.source = name
        self.lineno = self._linenos.get(name, 0)

    def _now(self, line: Line) -> str | None:
        """When this line was written: its own time, else that of the lines just before it."""
        if line.timestamp:
            return line.timestamp
        near = self._time_before(self._block, self._line_start) if self._block else None
        return near or self.last_time

    def _time_before(self, block: bytes, end: int, lines: int = 5) -> str | None:
        """The timestamp of the nearest of the few lines before `end` that carries one."""
        for _ in range(lines):
            if end <= 0:
                return None
            start = block.rfind(b"\n", 0, end - 1) + 1
            raw = block[start:end].rstrip(b"\n")
            if raw:
                ts = self.layout.line(self.source, 0, raw[:300]).timestamp
                if ts:
                    return ts
            end = start
        return None

    def _build_index(self) -> None:
        live = [n for n in self._by_needle if n not in self._observe_only and self._live(n)]
        self._observe_live = [
            n for n in self._observe_only if any(id(h) not in self._retired for h in self._by_needle[n])
        ]
        self._index_needles = live
        self._wasted = 0
        self._lacking = False
        # the first megabytes retire markers quickly: cheap-to-build automata until that settles
        self._dfa = self._fed >= DFA_AFTER
        self._index = make_index([n.encode("utf-8") for n in live], fast_build=not self._dfa)
        self._index_dirty = False

    def _live(self, needle: str) -> bool:
        """Does this needle still lead to something (a structure needle always does)?"""
        hs = self._by_needle.get(needle)
        return not hs or any(id(h) not in self._retired for h in hs)

    def retire(self, handler: Any) -> None:
        if id(handler) in self._retired:
            return
        self._retired.add(id(handler))
        self._index_dirty = True
        if isinstance(handler, Marker) and handler.what == "phases" and handler.phase in ("ready", "serving"):
            for n in handler.needles:
                self._track[n.encode("utf-8")] = handler.phase

    def _revive_phases(self) -> None:
        """A restart: the phase markers (and one-time observations) are needed again."""
        for m in self.profiles.markers:
            if m.what in ("phases", "observe") and id(m) in self._retired:
                self._retired.discard(id(m))
                self._index_dirty = True
                self._lacking = True  # the next line may already be the new run's: rebuild now
        self._track = {}

    def feed(self, block: bytes) -> None:
        """Process one block of whole lines: only lines holding a live needle are decoded."""
        if self.source not in self._indents:
            self._indents[self.source] = paste_indent(block)
        self._indent = self._indents[self.source]
        if (
            self._index is None
            or self._lacking
            or (self._index_dirty and self._wasted >= REFIND_AFTER)
            or (not self._dfa and self._fed >= DFA_AFTER)
        ):
            self._build_index()
        self._fed += len(block)
        base = self.lineno  # lines before this block
        n = len(block)
        matches = self._index.find(block)
        needles = self._index_needles
        pos = 0  # first byte not yet accounted for in self.lineno
        i, nm = 0, len(matches)
        while i < nm:
            nid, start_of_match = matches[i][0], matches[i][1]
            if start_of_match < pos:
                i += 1
                continue
            start = block.rfind(b"\n", pos, start_of_match) + 1
            if start < pos:
                start = pos
            nl = block.find(b"\n", start_of_match)
            end = n if nl < 0 else nl
            found = {needles[nid]}
            i += 1
            while i < nm and matches[i][1] < end:
                found.add(needles[matches[i][0]])
                i += 1
            self.lineno += block.count(b"\n", pos, start) + 1
            if self._index_dirty and not any(self._live(x) for x in found):
                self._wasted += 1
            self._block, self._line_start = block, start
            self._process(block[start:end], found)
            pos = end + 1
            while self._collect is not None and pos < n:
                nl = block.find(b"\n", pos)
                end = n if nl < 0 else nl
                self.lineno += 1
                self._process(block[pos:end], set())
                pos = end + 1
            if pos < n and (self._lacking or (self._index_dirty and self._wasted >= REFIND_AFTER)):
                # markers revived (a restart), or retired ones wasting time: search the rest anew
                self._build_index()
                needles = self._index_needles
                matches = [(m[0], m[1] + pos) for m in self._index.find(block[pos:])]
                i, nm = 0, len(matches)
        if pos < n:
            self.lineno += block.count(b"\n", pos, n)
            if not block.endswith(b"\n"):
                self.lineno += 1
        # the log's clock at the end of the block (most lines are never decoded)
        t = self._time_before(block, n)
        if t is not None:
            self.last_time = t
        self._block = b""
        for needle in self._observe_live:
            idx = block.rfind(needle.encode("utf-8"))
            if idx >= 0:
                # the latest stats line of this kind: keep its bytes, read it when a result is asked for
                start = block.rfind(b"\n", 0, idx) + 1
                nl = block.find(b"\n", idx)
                line = base + block.count(b"\n", 0, start) + 1
                self._latest_observed[frozenset({needle})] = (line, block[start : n if nl < 0 else nl])
        if self._series_needles:
            self._collect_series(block, base)
        # only worth scanning for once an unexplained traceback wants to know if serving went on
        for needle, phase in self._track.items() if self._want_progress else ():
            idx = block.rfind(needle)
            if idx >= 0:
                line = base + block.count(b"\n", 0, idx) + 1
                if line > self.phase_last_line.get(phase, 0):
                    self.phase_last_line[phase] = line

    def _collect_series(self, block: bytes, base: int) -> None:
        """Count every stats line of the block; read the line number and bytes only of those the
        sample keeps, and of the block's latest (a serving log is one stats line in ten)."""
        hits: list[int] = []
        wordings = 0
        for needle in self._series_needles:
            at = block.find(needle)
            wordings += at >= 0
            while at >= 0:  # one hit per line (vLLM V0 says "KV cache usage:" for GPU and CPU)
                hits.append(at)
                nl = block.find(b"\n", at)
                at = block.find(needle, nl) if nl >= 0 else -1
        if not hits:
            return
        if wordings > 1:  # several wordings in the block: the log's order, one point per line
            hits.sort()
            hits = [hits[0]] + [b for a, b in pairwise(hits) if block.find(b"\n", a, b) >= 0]
        n = len(block)
        sampler = self.series
        counted, line = 0, base

        def read(at: int) -> tuple[int, bytes]:
            nonlocal counted, line
            start = block.rfind(b"\n", 0, at) + 1
            line += block.count(b"\n", counted, start)
            counted = start
            nl = block.find(b"\n", at)
            return line + 1, block[start : n if nl < 0 else nl]

        for at in hits:
            if sampler.take():
                sampler.keep(self.source, *read(at))
        number, raw = read(hits[-1])
        sampler.last(self.source, number, raw)

    # --- one candidate line -------------------------------------------------------------

    def _process(self, raw: bytes, found: set[str]) -> None:
        if self._indent and raw.startswith(self._indent):
            raw = raw[len(self._indent) :]
        line = self.layout.line(self.source, self.lineno, raw)
        if line.timestamp:
            self.last_time = line.timestamp
        if self._collect is not None:
            self._collect_line(line)
            return
        handlers: list[Any] = []
        seen: set[int] = set()
        for needle in found:
            for h in self._by_needle.get(needle, ()):
                if id(h) not in seen and id(h) not in self._retired:
                    seen.add(id(h))
                    handlers.append(h)
        # markers first (a line that is both a phase marker and an error happened in that
        # phase), then rules, each in file order so results do not depend on set order
        handlers.sort(key=lambda h: self._order[id(h)])
        matched_rule = False
        words: list[tuple[Rule, str]] = []  # vocabulary terms on this line
        stream = line.stream
        msg = line.message
        # traceback shape first, so hits on this line know their traceback
        tb = self.open_tbs.get(stream)
        frame = _FRAME_RE.match(msg)
        if TRACEBACK_START in msg:
            if tb is not None:
                self._close_tb(stream, tb)
            tb = self._open_tb(stream, line)
        elif frame:
            if tb is None:
                tb = self._open_tb(stream, line)
            tb.last_frame = self.lineno
            path = frame.group("file").replace("\\", "/")  # Windows paths too
            tb.innermost_file = path.rsplit("-packages/", 1)[-1]
            if len(tb.frames) < MAX_FRAMES:
                file = path.rsplit("/", 1)[-1]
                tb.frames.append(frame.group("func"))
                tb.frames.append(file[:-3] if file.endswith(".py") else file)
        closing = tb is not None and not frame and TRACEBACK_START not in msg and bool(_EXC_RE.match(msg))
        if closing and tb is not None:
            tb.exception = line
        engine = self._active_engine()
        # outside a traceback, a quiet line's words are never kept (see _vocab): not even searched
        no_words = tb is None and line.level in QUIET_LEVELS
        vocab: list[Rule] = []
        for h in handlers:
            if isinstance(h, Rule):
                if h.layer == "vocabulary":
                    # searched after the rules, and only where a word can count: not on a frame
                    # line, not on a line a rule explains (compiling a class's words costs ms)
                    if not no_words and not frame:
                        vocab.append(h)
                    continue
                target = msg if h.scope == "message" else line.text
                m = h.search(target)
                if m is None:
                    continue
                matched_rule = True
                if _echoes_code(tb, line):
                    # the source a frame echoes; the exception line after it says the same
                    tb.explained = True
                    tb.echoed.append((h, line, typed_facts(m.groupdict())))
                    continue
                self._record(h, line, typed_facts(m.groupdict()), tb)
                if len(h.engines) == 1 and h.engines[0] not in ("any", "generic"):
                    # a message only one engine prints is evidence of that engine
                    self._detect_evidence(h.engines[0], RULE_EVIDENCE_WEIGHT, line)
            elif isinstance(h, Marker):
                self._marker(h, line, engine)
        for h in vocab if not matched_rule else ():
            m = h.search(msg if h.scope == "message" else line.text)
            if m is not None:
                words.append((h, m.group(0)))
        if not matched_rule:  # a line a specific rule explained is that rule's finding already
            for h, term in words:
                self._vocab(h, line, tb, term)
        if closing and tb is not None:
            self._close_tb(stream, tb)
        if matched_rule or tb is not None or frame or not msg.strip() or msg.startswith((" ", "\t")):
            return
        if line.level in ("ERROR", "CRITICAL"):
            self.unmatched_errors += 1
            self.last_unmatched_error = line
            if len(self.unmatched_examples) < 20:
                self.unmatched_examples.append(line)
            if line.level == "CRITICAL":
                self._synthetic(line, "A critical error no rule explains")
                return
        if words and (
            line.level == "ERROR"
            or (line.level is None and _ERROR_SHAPED.search(msg) and not _OWN_QUIET_LEVEL.search(msg[:100]))
        ):
            # an error line no rule explains, in a class's own words: the vocabulary names it
            self._synthetic(line, "An error line no rule explains")

    # --- vocabulary ---------------------------------------------------------------------

    def _vocab(self, rule: Rule, line: Line, tb: TracebackEvent | None, term: str) -> None:
        """A class's word on a line: kept for the unexplained errors around it, never a hit."""
        if _echoes_code(tb, line) and not line.message.lstrip().startswith(("assert ", "raise ")):
            return  # the source line a frame echoes is code, not what happened (a failed assert is)
        if tb is None and line.level in QUIET_LEVELS:
            return  # outside a traceback, only error text counts: INFO lines name tokenizers too
        vh = VocabHit(rule.id, rule.cls or "unknown_error", rule.title, line, term[:120])
        if tb is not None and len(tb.vocab) < MAX_VOCAB:
            tb.vocab.append(vh)
        for rec in self.vocab_takers:
            gap = line.number - rec.hit.line.number
            if rec.hit.line.source == line.source and 0 <= gap <= VOCAB_AFTER and len(rec.vocab) < MAX_VOCAB:
                rec.vocab.append(vh)
        self.recent_vocab.append(vh)
        if len(self.recent_vocab) > 2 * MAX_VOCAB:
            del self.recent_vocab[0]

    def _take_vocab(self, rec: RecordedHit, start: Line) -> None:
        """An unexplained error: the words just before it now, the words after it as they come."""
        rec.vocab = [
            v
            for v in self.recent_vocab
            if v.line.source == start.source and 0 <= start.number - v.line.number <= VOCAB_BEFORE
        ][-MAX_VOCAB:]
        near = [r for r in self.vocab_takers if rec.hit.line.number - r.hit.line.number <= VOCAB_AFTER]
        self.vocab_takers = [*near[-7:], rec]

    # --- hits ---------------------------------------------------------------------------

    def _record(self, rule: Rule, line: Line, facts: dict[str, Any], tb: TracebackEvent | None) -> None:
        self.hit_counts[rule.id] += 1
        if self.keep_rule_lines and len(self.rule_lines[rule.id]) < 1000:
            self.rule_lines[rule.id].append(line.number)
        if tb is not None:
            tb.explained = True
        rec = RecordedHit(
            Hit(rule.id, line, facts),
            rule,
            self.run,
            self.current_phase,
            frozenset(self.reached),
            self._now(line),
            tb,
        )
        self._keep(rule.id, rec)
        if rule.cls == "unknown_error":
            self._take_vocab(rec, tb.start if tb is not None else line)
        if tb is not None:
            self.tb_hits[id(tb)].append(rec)
        self.last_hit_by_stream[line.stream] = rec
        if tb is None:
            self.recent_untraced.append(rec)
            if len(self.recent_untraced) > 8:
                del self.recent_untraced[0]
        if not self.reached:
            self.pending_context.append(rec)

    def _keep(self, rid: str, rec: RecordedHit) -> None:
        """Keep the rule's first hits and a window of its latest; count the runs it hit in."""
        self._seq += 1
        if self._rule_last_run.get(rid) != self.run:
            self._rule_last_run[rid] = self.run
            self.rule_runs[rid] += 1
        if self.hit_counts[rid] <= FIRST_HITS_KEPT:
            self.hits.append(rec)
            self._hit_seq.append(self._seq)
        else:
            self._tail_hits.setdefault(rid, deque(maxlen=LAST_HITS_KEPT)).append((self._seq, rec))

    def _kept_hits(self) -> list[RecordedHit]:
        if not self._tail_hits:
            return list(self.hits)
        both = [
            *zip(self._hit_seq, self.hits, strict=True),
            *(x for t in self._tail_hits.values() for x in t),
        ]
        return [rec for _seq, rec in sorted(both, key=lambda x: x[0])]

    def _synthetic(self, line: Line, title: str, tb: TracebackEvent | None = None) -> None:
        rid = "generic.unexplained-error"
        self._want_progress = True
        self.hit_counts[rid] += 1
        rec = RecordedHit(
            Hit(rid, line, {}),
            None,
            self.run,
            self.current_phase,
            frozenset(self.reached),
            self.last_time,
            tb,
            synthetic_title=title,
        )
        self._keep(rid, rec)
        self._take_vocab(rec, tb.start if tb is not None else line)
        if not self.reached:
            self.pending_context.append(rec)

    # --- tracebacks ---------------------------------------------------------------------

    def _open_tb(self, stream: str, line: Line) -> TracebackEvent:
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
                self.tb_hits[id(tb)].append(prev)
            if prev.rule is not None:
                tb.explained = True
        for rec in self.recent_untraced:
            if rec.tb is None and rec.near_tb is None and 0 <= line.number - rec.hit.line.number <= 5:
                rec.near_tb = tb
        self.recent_untraced = []
        self.open_tbs[stream] = tb
        return tb

    def _close_tb(self, stream: str, tb: TracebackEvent) -> None:
        self.open_tbs.pop(stream, None)
        hit_rules = {r.rule.id for r in self.tb_hits.get(id(tb), ())}
        for rule, echo_line, facts in tb.echoed:
            if rule.id not in hit_rules:  # the exception line did not say it: the code did
                hit_rules.add(rule.id)
                self._record(rule, echo_line, facts, tb)
        if not tb.explained:
            evidence = tb.exception or tb.start
            title = (
                "An exception no rule explains"
                if tb.exception
                else "A traceback cut before its exception line"
            )
            self._synthetic(evidence, title, tb)
        self.tb_hits.pop(id(tb), None)

    # --- markers ------------------------------------------------------------------------

    def _active_engine(self) -> str | None:
        if self.forced_engine:
            return self.forced_engine
        if not self.engine_scores:
            return None
        best = max(self.engine_scores.items(), key=lambda kv: kv[1])
        return best[0] if best[1] >= ENGINE_MIN_SCORE else None

    def _marker(self, mk: Marker, line: Line, engine: str | None) -> None:
        what = mk.what
        if what == "detect":
            if mk.search(line.text):
                self._detect_evidence(mk.engine, mk.weight, line)
            return
        shared = mk.engine == "generic" and what == "observe"  # e.g. CUDA_VISIBLE_DEVICES, any engine
        if engine is not None and mk.engine != engine and not shared:
            return
        if engine is None and mk.engine == "generic" and what == "phases" and self.engine_scores:
            # an engine is half-detected: its own markers are better than the generic guesses
            return
        m = mk.search(mk.target(line))
        if m is None:
            return
        if what == "variants":
            key = f"{mk.engine}/{mk.variant or ''}"  # a variant is its engine's (vLLM's v0/v1)
            self.variant_scores[key] += mk.weight
            if max(self.variant_scores.values()) >= VARIANT_DECIDED:
                self._retire_all(lambda x: x.what == "variants")
        elif what == "version":
            if self.version is None:
                self.version = m.group("version")
                self.version_engine = mk.engine
                self._retire_all(lambda x: x.what == "version")
        elif what == "phases":
            self._phase(mk.phase or "", line)
        elif what == "observe":
            # sizes and counts the engine reports (KV tokens, running requests, usage): latest wins
            facts = typed_facts(m.groupdict())
            self.observed.update(facts)
            for k in facts:
                self.observed_where[k] = (line.number, line.message.strip()[:300])
            if not mk.repeat:
                self.retire(mk)  # said once per start (revived on a restart)
        elif what == "launch":
            text = m.groupdict().get("repr") or ""
            if mk.kind == "rust_debug" and text.rstrip().endswith("{"):
                self._collect = (mk, [text], 0)
                return
            self.launch_raw[mk.engine].update(parse_repr(mk.kind or "", text))

    def _detect_evidence(self, engine: str, weight: int, line: Line) -> None:
        self.engine_scores[engine] += weight
        self._maybe_decide_engine()
        if weight > self._reason_weight.get(engine, 0):
            # the strongest evidence seen names the engine in the report
            self._reason_weight[engine] = weight
            shown = (line.message.strip() or line.text.strip())[:120]
            self.engine_reason[engine] = f"{line.source}:{line.number}: {shown}"

    def _retire_all(self, pred: Any) -> None:
        for m in self.profiles.markers:
            if pred(m):
                self.retire(m)

    def _maybe_decide_engine(self) -> None:
        if self.forced_engine:
            return
        ranked = sorted(self.engine_scores.values(), reverse=True)
        if (
            ranked[0] >= ENGINE_DECIDED
            and ranked[0] - (ranked[1] if len(ranked) > 1 else 0) >= ENGINE_DECIDED // 2
        ):
            engine = self._active_engine()
            self._retire_all(
                lambda x: (
                    x.what == "detect"
                    or (x.engine != engine and not (x.engine == "generic" and x.what == "observe"))
                )
            )

    def _collect_line(self, line: Line) -> None:
        assert self._collect is not None
        mk, parts, count = self._collect
        parts.append(line.message.strip())
        count += 1
        if line.message.strip() in ("}", "},") or count > 400:
            self._collect = None
            self.launch_raw[mk.engine].update(parse_repr(mk.kind or "", " ".join(parts)))
        else:
            self._collect = (mk, parts, count)

    def _phase(self, phase: str, line: Line) -> None:
        idx = PHASE_INDEX[phase]
        cur = PHASE_INDEX[self.current_phase] if self.current_phase else -1
        if phase in ("start", "args") and cur >= PHASE_INDEX["distributed_init"]:
            # the server started again: a new run begins
            self.apply_observed()
            if len(self.observed_before) < 64:
                self.observed_before.append((line.number, dict(self.observed)))
            self.run += 1
            self.series = SeriesSampler()  # the serving series of the new run
            self.timeline = []
            self.reached = set()
            self.current_phase = None
            self.phase_last_line = {}
            self.run_start_line = line.number
            self._revive_phases()
            cur = -1
        self.phase_last_line[phase] = line.number
        if phase in self.reached:
            return
        self.reached.add(phase)
        if phase not in ("start", "args"):  # those two must stay: they reveal a restart
            self._retire_all(lambda x: x.what == "phases" and x.phase == phase)
        # a line without its own time (uvicorn's) happened at the last time the log showed
        when = self._now(line)
        self.timeline.append(PhaseMark(phase, line.number, when, line.source, line.message[:200]))
        if idx > cur:
            self.current_phase = phase
        if self.pending_context:
            for rec in self.pending_context:
                if line.number - rec.hit.line.number <= CONTEXT_LINES and line.source == rec.hit.line.source:
                    rec.phase_after = phase
            self.pending_context = []

    # --- end ----------------------------------------------------------------------------

    def apply_observed(self) -> None:
        """Read the stats lines kept as bytes (only the latest of each kind matters)."""
        for (number, raw), found in sorted((v, k) for k, v in self._latest_observed.items()):
            line = self.layout.line(self.source, number, raw)
            for needle in found:
                for mk in self._by_needle[needle]:
                    m = mk.search(mk.target(line)) if id(mk) not in self._retired else None
                    if m is not None:
                        facts = typed_facts(m.groupdict())
                        self.observed.update(facts)
                        for k in facts:
                            self.observed_where[k] = (number, line.message.strip()[:300])
        self._latest_observed = {}

    @property
    def open_tracebacks(self) -> int:
        return len(self.open_tbs)

    def finish(self) -> ScanResult:
        """The log has ended: close what is open and hand over the result."""
        self.apply_observed()
        for stream, tb in list(self.open_tbs.items()):
            self._close_tb(stream, tb)
        self._closing_error()
        return self.snapshot()

    def _closing_error(self) -> None:
        """A startup whose log ends on an ERROR line no rule or word explains (a config check
        that refuses a value, a launcher's last word) failed there: an unexplained finding,
        not an 'incomplete' log. Not after ready, nor when anything was found after it."""
        line = self.last_unmatched_error
        if line is None or "ready" in self.reached or line.source != self.source:
            return
        if self.lineno - line.number > CLOSING_TAIL:
            return
        if any(
            r.hit.line.number >= line.number and r.hit.line.source == line.source for r in self._kept_hits()
        ):
            return
        self._synthetic(line, "The startup ends on an error no rule explains")

    def snapshot(self) -> ScanResult:
        """The result so far, without ending anything (for live diagnosis)."""
        self.apply_observed()
        engine = self._active_engine()
        launch: dict[str, Any] = {}
        names: dict[str, str] = {}
        for prof in self.profiles.by_engine.values():
            names.update(prof.names)
        if engine:
            names.update(self.profiles.get(engine).names)
        # generic first, then the detected engine's dumps win
        order = sorted(self.launch_raw, key=lambda e: (e == engine, e != "generic"))
        for e in order:
            launch.update(canonical_launch(self.launch_raw[e], names))
        return ScanResult(
            hits=self._kept_hits(),
            hit_counts=dict(self.hit_counts),
            timeline=list(self.timeline),
            earlier_runs=self.run,
            engine_scores=dict(self.engine_scores),
            engine_reason=self.engine_reason,
            variant_scores=dict(self.variant_scores),
            version=self.version,
            launch=launch,
            lines=self.lineno,
            last_time=self.last_time,
            unmatched_errors=self.unmatched_errors,
            unmatched_examples=self.unmatched_examples,
            rule_lines=dict(self.rule_lines),
            phase_last_line=dict(self.phase_last_line),
            run_start_line=self.run_start_line,
            observed=dict(self.observed),
            observed_where=dict(self.observed_where),
            observed_before=list(self.observed_before),
            rule_runs=dict(self.rule_runs),
            series=self.series.snapshot(),
            series_seen=self.series.seen,
        )
