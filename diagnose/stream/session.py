"""The streaming library API: one session per log source, fed lines or bytes as they come.

    from diagnose.stream import Sessions

    sessions = Sessions()                      # loads the rules once; every session shares them
    for source, line in records:               # lines of many servers, interleaved
        for event in sessions.feed_line(source, line):
            print(event.to_json())             # a phase reached, a finding, ready, failed, ...
    for event in sessions.close_all():         # the logs ended: final verdicts
        ...

A session keeps only the scan's own bounded state (the first and latest hits per rule, the
open tracebacks, a sampled serving series) and the lines not yet scanned (at most
`FEED_BYTES`): they are scanned a block at a time, which is what makes thousands of
interleaved sources cheap; `flush()` scans what is pending at once. A session emits an event
only when what it knows changes; the diagnosis behind it is built only then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..findings.hang import live_hang_finding
from ..knowledge.loaded import Knowledge
from ..match.scanner import Scanner
from ..model.records import Diagnosis, Finding
from ..pipeline.stages import diagnose

SCHEMA = "diagnose.stream/1"
# Lines held before they are scanned as one block: the scan's per-call cost spread over many
# lines (a block per line costs ~10× more), and the most a session buffers.
FEED_BYTES = 32 << 10
# A consequence line ("EngineCore failed to start") often comes before its cause's traceback:
# a failure is reported once its cause is in, or this many seconds after (as `watch` does).
CAUSE_GRACE_S = 2.0
MAX_LINE = 1 << 20  # a longer line keeps its head (the scan's own limit)

EVENT_KINDS = ("phase", "finding", "ready", "failed", "stopped", "hang", "closed")
NOT_A_SERVER = "not_inference_server"  # status of a source no engine was detected in (fleet scope)
# status of a source in which two engines' own lines were seen: two servers' lines merged
TWO_SERVERS = "two_servers_in_one_source"
# what any program can print: without an engine's own line, these say nothing of a server
_ANY_PROGRAM = ("unknown_error", "request")


@dataclass(slots=True)
class Event:
    """One change in what a source's log says."""

    kind: str  # one of EVENT_KINDS
    source: str
    status: str  # the diagnosis's status after the change: failed / degraded / ready / incomplete
    phase: str | None  # the last startup phase reached
    line: int | None = None  # the line that made the change
    time: str | None = None  # the log's own time of that line, as printed (no year or zone, often)
    at: str | None = None  # that line's record (or collector) time, ISO-8601 UTC, when it had one
    finding: dict[str, Any] | None = None  # the primary finding (class, rule, oom_phase, evidence…)
    change: dict[str, Any] | None = None  # the next change to make (param, flag, from, to, why)
    labels: dict[str, str] = field(default_factory=dict)  # the source's identity (pod, node, …)
    diagnosis: Diagnosis | None = None  # the whole diagnosis (not in the JSON line)
    gone: bool = False  # closed because the source itself is gone (its file removed), not quiet

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "event": self.kind,
            "source": self.source,
            "labels": self.labels,
            "status": self.status,
            "phase": self.phase,
            "line": self.line,
            "time": self.at,
            "log_time": self.time,
            "finding": self.finding,
            "change": self.change,
            # start to ready and each phase by the log's own timestamps, once a startup is over
            "durations": self.diagnosis.durations
            if self.diagnosis is not None and self.kind in ("ready", "closed")
            else None,
        }


def _finding_json(d: Diagnosis) -> dict[str, Any] | None:
    p = d.primary
    if p is None:
        return None
    return {
        "class": p.cls,
        "layer": p.layer,
        "rule": p.rule,
        "severity": p.severity,
        "oom_phase": p.oom_phase,
        "title": p.title,
        "evidence": p.evidence,
        "line": p.line,
        "time": p.time,
    }


class StreamSession:
    """The live diagnosis of one source's log (the library behind `diagnose stream`)."""

    def __init__(
        self,
        source: str,
        know: Knowledge,
        engine: str | None = None,
        labels: dict[str, str] | None = None,
        budgets: dict[str, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        scoped: bool = False,
    ):
        self.source = source
        # a fleet's sources are any containers: one that never printed an engine's line fails
        # only of what is a server's own (memory, GPUs, ports), not of any program's traceback
        self.scoped = scoped
        self.know = know
        self.engine = engine
        self.labels = dict(labels or {})
        self.labels_given: dict[str, str] | None = None
        self.budgets = budgets  # seconds without progress per phase before a hang; None: no hang check
        self.clock = clock
        self.scanner = Scanner(know.rules, know.profiles, engine=engine)
        self.scanner.set_source(source)
        self.closed = False
        self.last_active = clock()
        self._partial = b""  # the start of a line not yet ended
        self._pending: list[bytes] = []  # whole lines not yet scanned
        self._pending_bytes = 0
        self._pending_since = 0.0  # when the oldest pending line came
        self._pending_at_tick = 0  # pending bytes at the last tick (no growth since: gone quiet)
        self._phases_told = 0
        self._hits_seen = 0
        self._told: tuple[Any, ...] = ("incomplete", None, None)  # status, primary rule, line
        self._failed_since: float | None = None
        self._progress_at = self.last_active
        self._hang_told: str | None = None
        self._final: Diagnosis | None = None
        self._fed = 0  # lines fed so far (the scanner numbers them the same way)
        self._times: list[tuple[int, str | int]] = []  # (first line, record time) where it changed

    # --- input ---------------------------------------------------------------------------

    def feed(self, data: bytes | str) -> list[Event]:
        """Bytes or text as they come (lines may be cut anywhere); events once scanned."""
        if self.closed:
            raise ValueError(f"session {self.source!r} is closed")
        raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
        self.last_active = self.clock()
        if not raw:
            return []
        cut = raw.rfind(b"\n")
        if cut < 0:
            self._partial = (self._partial + raw)[:MAX_LINE]
            return []
        self._fed += raw.count(b"\n")
        whole = self._partial + raw[: cut + 1]
        self._partial = raw[cut + 1 :]
        return self._queue(whole)

    def feed_line(self, line: str | bytes, at: str | int | None = None) -> list[Event]:
        """One whole line (its newline optional); `at`: its record's time (RFC 3339 text or an
        epoch count), which events about it carry as ISO-8601 UTC."""
        if at is not None and (not self._times or self._times[-1][1] != at):
            self._mark_time(at)
        raw = line.encode("utf-8", "surrogateescape") if isinstance(line, str) else line
        if self._partial or self.closed or b"\n" in raw:
            return self.feed(raw if raw.endswith(b"\n") else raw + b"\n")
        # the common case, without feed()'s cutting: one line, nothing pending before it
        self.last_active = self.clock()
        self._fed += 1
        return self._queue(raw, b"\n")

    def _mark_time(self, at: str | int) -> None:
        """The record time from the next line on; bounded: beyond 4,096 changes every other one
        is dropped (a line's time is then its neighbour's, seconds apart at most)."""
        times = self._times
        times.append((self._fed + 1, at))
        if len(times) > 4096:
            self._times = times[::2] + ([times[-1]] if len(times) % 2 == 0 else [])

    def record_time(self, line: int | None) -> str | None:
        """The record time of a line, ISO-8601 UTC (None when its records carried none)."""
        from bisect import bisect_right

        from ..read.clock import utc_time

        if not self._times:
            return None
        if line is None:
            return utc_time(self._times[-1][1])
        i = bisect_right(self._times, line, key=lambda t: t[0])
        return utc_time(self._times[i - 1][1]) if i else None

    def _queue(self, whole: bytes, newline: bytes = b"") -> list[Event]:
        """Whole lines to scan with the next block (`newline`: the one a single line lacks, kept
        apart: the block is joined once, a line not copied to add it)."""
        pending = self._pending
        if not pending:
            self._pending_since = self.last_active
        pending.append(whole)
        if newline:
            pending.append(newline)
        self._pending_bytes += len(whole) + len(newline)
        return self.flush() if self._pending_bytes >= FEED_BYTES else []

    def flush(self) -> list[Event]:
        """Scan the lines pending now; the events they cause."""
        return self._changes(final=False) if self._scan_pending() else []

    def _scan_pending(self) -> bool:
        """The pending lines scanned as one block; whether there were any."""
        if not self._pending:
            return False
        block = b"".join(self._pending)
        self._pending, self._pending_bytes, self._pending_at_tick = [], 0, 0
        self.scanner.feed(block)
        return True

    def tick(self, hold_s: float = 0.0) -> list[Event]:
        """An idle moment: scan what is pending, report a failure whose cause did not come and
        a phase stuck past its budget. `hold_s`: a source still writing keeps its pending lines
        until they are that old (a block of FEED_BYTES is cheaper to read than a second's few
        lines); one that went quiet since the last tick (a server that died) is read now."""
        if self.closed:
            return []
        if self._pending:
            quiet = self._pending_bytes == self._pending_at_tick
            self._pending_at_tick = self._pending_bytes
            if quiet or self.clock() - self._pending_since >= hold_s:
                return self.flush() or self._changes(final=False)
        return self._changes(final=False)

    def close(self) -> list[Event]:
        """The log ended: everything scanned, open tracebacks closed, the final verdict."""
        if self.closed:
            return []
        if self._partial:
            self._pending.append(self._partial + b"\n")
            self._partial = b""
        self._scan_pending()
        events = self._changes(final=True)
        self.closed = True
        events.append(self._event("closed", self._diagnosis(final=True), line=self.scanner.lineno))
        return events

    # --- what is known ---------------------------------------------------------------------

    @property
    def lines(self) -> int:
        return self.scanner.lineno

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes + len(self._partial)

    def diagnosis(self) -> Diagnosis:
        """The diagnosis of what was scanned so far (pending lines are scanned first)."""
        if not self.closed:
            self.flush()
        return self._diagnosis(final=self.closed)

    def _diagnosis(self, final: bool, extra: list[Finding] | None = None) -> Diagnosis:
        # local=False: the server ran elsewhere, so this host's ports say nothing about it
        if not final:
            return diagnose(
                self.scanner.snapshot(), self.know, self.source, self.engine, extra=extra, local=False
            )
        if self._final is None:  # the scan ends once: finish() closes what is open
            self._final = diagnose(self.scanner.finish(), self.know, self.source, self.engine, local=False)
        return self._final

    # --- events ----------------------------------------------------------------------------

    def out_of_scope(self, d: Diagnosis) -> bool:
        """Scoped: no engine's line was seen, and what failed is what any program prints."""
        p = d.primary
        return (
            self.scoped
            and self.engine is None
            and p is not None
            and p.cls in _ANY_PROGRAM
            and not any(v > 0 for v in self.scanner.server.engine_scores.values())
        )

    def two_servers(self) -> list[str]:
        """The engines whose own entry point spoke in this one source, when more than one did:
        an engine's own line (its args dump, its version banner) is never an import's, so two
        of them are two servers' lines merged — a verdict would mix them."""
        own = self.scanner.server.own_engines
        return sorted(own) if len(own) > 1 else []

    def _event(self, kind: str, d: Diagnosis, line: int | None = None, time_: str | None = None) -> Event:
        refused = TWO_SERVERS if self.two_servers() else NOT_A_SERVER if self.out_of_scope(d) else None
        if refused:  # no finding and no change: the source's verdict is not a server's
            return Event(kind, self.source, refused, d.last_phase, line, labels=self.labels, diagnosis=d)
        p = d.primary
        line = line if line is not None else (p.line if p else None)
        return Event(
            kind=kind,
            source=self.source,
            status=d.status,
            phase=d.last_phase,
            line=line,
            time=time_ if time_ is not None else (p.time if p else None),
            at=self.record_time(line),
            finding=_finding_json(d),
            change=d.advice[0].to_json() if d.advice else None,
            labels=self.labels,
            diagnosis=d,
        )

    def _changes(self, final: bool) -> list[Event]:
        """Events for what changed since the last call; the diagnosis is built only when a
        phase, a hit or the passing of time can have changed it."""
        sc = self.scanner
        now = self.clock()
        timeline = sc.server.timeline
        hits = sc.book.recorded
        new_phases = timeline[self._phases_told :]
        grown = bool(new_phases) or hits != self._hits_seen
        waiting = self._failed_since is not None and self._told[0] != "failed"
        if grown:
            self._progress_at = now
            self._hang_told = None
        events = [
            Event(
                "phase",
                self.source,
                self._told[0],
                m.phase,
                m.line,
                m.time,
                self.record_time(m.line),
                labels=self.labels,
            )
            for m in new_phases
        ]
        self._phases_told = len(timeline)
        # the diagnosis (all the stages) only when a verdict can have changed: a new hit, the
        # server ready, a failure waiting for its cause, the end
        asks = hits != self._hits_seen or any(m.phase in ("ready", "serving") for m in new_phases)
        if asks or waiting or final:
            self._hits_seen = hits
            events += self._verdicts(self._diagnosis(final=final), now, final)
        hang = self._hang(now)
        if hang is not None:
            events.append(hang)
        return events

    def _verdicts(self, d: Diagnosis, now: float, final: bool) -> list[Event]:
        if self.two_servers():  # refused, said once: no verdict of two servers merged
            if self._told[0] == TWO_SERVERS:
                return []
            self._told = (TWO_SERVERS, None, None)
            return [self._event("finding", d)]
        if self.out_of_scope(d):
            return []  # its closing event says what it is
        p = d.primary
        state = (d.status, p.rule if p else None, p.line if p else None)
        if d.status == "failed":
            if self._failed_since is None:
                self._failed_since = now
            settled = p is not None and not p.consequence and not self.scanner.tbs.open
            if not (final or settled or now - self._failed_since >= CAUSE_GRACE_S):
                return []  # the cause may be on its way
        if state == self._told:
            return []
        before, self._told = self._told, state
        if d.status == "failed":
            kind = "stopped" if p is not None and p.cls == "stop" else "failed"
            return [self._event(kind if before[0] != "failed" else "finding", d)]
        if p is not None and p.cls == "stop":
            return [self._event("stopped", d)]
        if d.status in ("ready", "degraded") and before[0] not in ("ready", "degraded"):
            ready = next((m for m in reversed(d.timeline) if m.phase == "ready"), None)
            if ready is not None or d.last_phase == "serving":
                return [self._event("ready", d, ready.line if ready else None, ready.time if ready else None)]
        return [self._event("finding", d)] if p is not None and state[1:] != before[1:] else []

    def _hang(self, now: float) -> Event | None:
        """A phase stuck past its budget: the live hang finding (as `watch` makes it) joins the
        diagnosis, which then says what to change."""
        if not self.budgets or self._told[0] in ("failed", "ready", "degraded"):
            return None
        timeline = self.scanner.server.timeline
        phase = timeline[-1].phase if timeline else "start"
        if phase in ("ready", "serving") or self._hang_told == phase:
            return None
        budget = self.budgets.get(phase)
        if budget is None or now - self._progress_at <= budget:
            return None
        self._hang_told = phase
        stuck = live_hang_finding(
            timeline, phase, now - self._progress_at, budget, self.source, self.scanner.lineno, ""
        )
        return self._event("hang", self._diagnosis(final=False, extra=[stuck]))


class Sessions:
    """Many sources in one process: a session per source, sharing the compiled rules.

    `max_sessions` bounds them: a new source beyond it closes the one idle the longest (its
    final events are returned with the new line's). `idle_s`: `expire()` closes the sessions
    that received nothing for that long. `hold_s`: how long `tick()` lets a source that is still
    writing keep its lines unread (see StreamSession.tick)."""

    def __init__(
        self,
        know: Knowledge | None = None,
        engine: str | None = None,
        max_sessions: int = 10_000,
        idle_s: float | None = None,
        budgets: dict[str, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        hold_s: float = 0.0,
        scoped: bool = False,
    ):
        if know is None:
            know = Knowledge.load(None)
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self.know = know
        self.engine = engine
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self.budgets = budgets
        self.clock = clock
        self.hold_s = hold_s  # see StreamSession.tick
        self.scoped = scoped  # see StreamSession.out_of_scope
        self._open: dict[str, StreamSession] = {}  # by source (each knows when it was last fed)
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, source: object) -> bool:
        return source in self._open

    def get(self, source: str) -> StreamSession | None:
        return self._open.get(source)

    def sessions(self) -> list[StreamSession]:
        return list(self._open.values())

    def open(self, source: str, labels: dict[str, str] | None = None) -> tuple[StreamSession, list[Event]]:
        """The source's session (opened now if new) and the events of any session it displaced."""
        s = self._open.get(source)
        events: list[Event] = []
        if s is None:
            while len(self._open) >= self.max_sessions:
                # the idlest, found when needed (rare) rather than kept in order on every line
                oldest = min(self._open.values(), key=lambda x: x.last_active).source
                events += self._open.pop(oldest).close()
                self.evicted += 1
            s = self._open[source] = StreamSession(
                source, self.know, self.engine, labels, self.budgets, self.clock, self.scoped
            )
        elif labels and labels is not s.labels_given:
            s.labels.update(labels)
        if labels:
            s.labels_given = labels  # a reader hands the same dict for a source: updated once
        return s, events

    def feed(self, source: str, data: bytes | str, labels: dict[str, str] | None = None) -> list[Event]:
        s, events = self.open(source, labels)
        return events + s.feed(data)

    def feed_line(
        self,
        source: str,
        line: str | bytes,
        labels: dict[str, str] | None = None,
        at: str | int | None = None,
    ) -> list[Event]:
        """One line of a source; `at`: its record's time (see StreamSession.feed_line)."""
        s = self._open.get(source)
        if s is not None and (not labels or labels is s.labels_given):  # an open source, as it was
            return s.feed_line(line, at)
        s, events = self.open(source, labels)
        return events + s.feed_line(line, at)

    def close(self, source: str, gone: bool = False) -> list[Event]:
        """The source's final events; `gone`: it ended because it no longer exists (a deleted
        pod's file), which lets its failure's alert and series go too."""
        s = self._open.pop(source, None)
        events = s.close() if s is not None else []
        for e in events:
            e.gone = gone
        return events

    def tick(self) -> list[Event]:
        """Scan what every session holds; close the idle ones (see `expire`)."""
        events: list[Event] = []
        for s in list(self._open.values()):
            events += s.tick(self.hold_s)
        return events + self.expire()

    def expire(self) -> list[Event]:
        if self.idle_s is None:
            return []
        now = self.clock()
        events: list[Event] = []
        for source, s in list(self._open.items()):
            if now - s.last_active >= self.idle_s:
                events += self.close(source)
        return events

    def close_all(self) -> list[Event]:
        events: list[Event] = []
        for source in list(self._open):
            events += self.close(source)
        return events


def scan_lines(lines: Iterable[str], source: str = "-", know: Knowledge | None = None) -> Diagnosis:
    """A whole log given as lines, through one session: its final diagnosis."""
    s = StreamSession(source, know or Knowledge.load(None))
    for line in lines:
        s.feed_line(line)
    s.close()
    return s.diagnosis()
