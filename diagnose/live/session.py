"""Live diagnosis for `watch` and `run`: the scan pipeline fed as the log grows.

A LiveSession takes blocks of complete lines, keeps the startup view (phases with their
wall-clock durations, the current phase, load progress, the last meaningful line), and
after each block (or each idle second) decides: fatal → stop with the diagnosis; ready →
stop (unless following); no progress in a phase past its budget → a `hang` finding.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from ..findings.hang import HANG_BUDGET_S, live_hang_finding
from ..host.gpus import DeviceSnapshot
from ..knowledge.loaded import Knowledge
from ..match.scanner import Scanner
from ..model.records import PHASE_INDEX, Diagnosis, Finding
from ..outputs.text import PHASE_LABEL
from ..pipeline.stages import diagnose
from ..read.clock import seconds as log_seconds

# A consequence line ("EngineCore failed to start") often comes before its cause's
# traceback: wait this long for the cause before giving the verdict.
CAUSE_GRACE_S = 2.0


def _seconds(text: str, item: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{item!r}: the seconds must be a number") from None
    if not 0 < value < 1e9:  # also NaN and infinity
        raise ValueError(f"{item!r}: the seconds must be a positive number")
    return value


def parse_budgets(items: list[str] | None) -> dict[str, float]:
    """`PHASE=SECONDS` (or a bare number for every phase) → budgets."""
    out = dict(HANG_BUDGET_S)
    for item in items or []:
        if "=" in item:
            phase, _, secs = item.partition("=")
            phase = phase.strip().replace("-", "_")
            if phase not in PHASE_INDEX:
                raise ValueError(f"unknown phase {phase!r} in --budget (phases: {', '.join(PHASE_INDEX)})")
            out[phase] = _seconds(secs, item)
        else:
            value = _seconds(item, item)
            out = {k: value for k in out}
            out.setdefault("start", value)
    return out


@dataclass
class Verdict:
    """What a live session concluded, and the diagnosis it stands on."""

    kind: str  # fatal / ready / hang / timeout / stopped (at --timeout, after ready) / ended
    diagnosis: Diagnosis


@dataclass
class LiveSession:
    know: Knowledge
    source: str
    engine: str | None = None
    budgets: dict[str, float] = field(default_factory=lambda: dict(HANG_BUDGET_S))
    follow_after_ready: bool = False
    snapshot: DeviceSnapshot | None = None
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.scanner = Scanner(self.know.rules, self.know.profiles, engine=self.engine)
        self.scanner.set_source(self.source)
        self.started = self.clock()
        self.phase_seen: dict[str, float] = {}  # phase -> wall time first seen
        self.phase_log: dict[str, float] = {}  # phase -> the log's own time of its line (seconds)
        self.progress_at = self.started  # last phase change or load progress
        self.last_line = ""
        self.lines = 0
        self.fatal_since: float | None = None
        self.ready_reported = False
        self._load_done = -1

    # --- input ---------------------------------------------------------------------------

    def feed(self, block: bytes) -> None:
        self.scanner.feed(block)
        self.lines = self.scanner.lineno
        now = self.clock()
        for m in self.scanner.server.timeline:
            if m.phase not in self.phase_seen:
                self.phase_seen[m.phase] = now
                self.progress_at = now
                t = log_seconds(m.time)
                if t is not None:
                    self.phase_log[m.phase] = t
        tail = block.rstrip(b"\n").rsplit(b"\n", 1)[-1]
        if tail.strip():
            text = self.scanner.layout.line(self.source, self.lines, tail).message.strip()
            if text:
                from ..base.redact import redact  # the live view shows the log's own last line

                self.last_line = redact(text[:200])

    def stop_requested(self, why: str) -> None:
        """From here on the server is being stopped on purpose (see Scanner.stop_requested)."""
        self.scanner.stop_requested(why)

    # --- decisions -----------------------------------------------------------------------

    @property
    def current_phase(self) -> str | None:
        if not self.phase_seen:
            return None
        return max(self.phase_seen, key=lambda p: PHASE_INDEX[p])

    def diagnosis(self, extra: list[Finding] | None = None, final: bool = False) -> Diagnosis:
        result = self.scanner.finish() if final else self.scanner.snapshot()
        return diagnose(result, self.know, self.source, self.engine, self.snapshot, extra=extra)

    def check(self, final: bool = False) -> Verdict | None:
        """After new input or an idle tick: is there a verdict yet?"""
        now = self.clock()
        self.scanner.apply_observed()
        done = self.scanner.server.observed.get("shards_done")
        if isinstance(done, int) and done > self._load_done:
            self._load_done = done  # weights still arriving: progress, not a hang
            self.progress_at = now
        d = self.diagnosis(final=final)
        if d.status == "failed":
            p = d.primary
            settled = p is not None and not p.consequence and not self.scanner.tbs.open
            if self.fatal_since is None:
                self.fatal_since = now
            if final or settled or now - self.fatal_since >= CAUSE_GRACE_S:
                return Verdict("fatal", self.diagnosis(final=True) if not final else d)
            return None
        if d.status in ("ready", "degraded") and "ready" in self.phase_seen and not self.follow_after_ready:
            return Verdict("ready", d)
        phase = self.current_phase or "start"
        if phase not in ("ready", "serving"):
            budget = self.budgets.get(phase)
            stuck = now - max(self.progress_at, self.phase_seen.get(phase, self.started))
            if budget is not None and stuck > budget:
                return Verdict("hang", self.diagnosis(extra=[self.hang_finding(phase, stuck, budget)]))
        return None

    def hang_finding(self, phase: str, stuck: float, budget: float) -> Finding:
        timeline = self.scanner.server.timeline
        return live_hang_finding(timeline, phase, stuck, budget, self.source, self.lines, self.last_line)

    # --- view ----------------------------------------------------------------------------

    def since_start(self, phase: str) -> tuple[float, str]:
        """When a phase came, from the first one: by the log's own timestamps when its lines
        carry them ("log"), else by this watcher's clock ("wall": a replayed or piped log would
        read 0 s for a four-minute startup otherwise)."""
        first = min(self.phase_log.values()) if self.phase_log else None
        if phase in self.phase_log and first is not None and self.phase_log[phase] >= first:
            return self.phase_log[phase] - first, "log"
        return self.phase_seen.get(phase, self.clock()) - self.started, "wall"

    def ready_said(self) -> str:
        """ "ready in 1 min 00 s by the log's timestamps" (or the watcher's clock, said so)."""
        from ..pipeline.durations import span

        at, clock = self.since_start("ready")
        by = "by the log's timestamps" if clock == "log" else "by diagnose's clock (the log prints no times)"
        return f"ready in {span(at)} {by}"

    def durations(self) -> list[tuple[str, float | None]]:
        seen = sorted(self.phase_seen.items(), key=lambda kv: kv[1])
        out: list[tuple[str, float | None]] = []
        for i, (phase, t) in enumerate(seen):
            if i + 1 >= len(seen):
                out.append((phase, None))
                continue
            nxt = seen[i + 1][0]
            if phase in self.phase_log and nxt in self.phase_log:  # the log's clock when it has one
                out.append((phase, max(0.0, self.phase_log[nxt] - self.phase_log[phase])))
            else:
                out.append((phase, seen[i + 1][1] - t))
        return out

    def renderable(self) -> Any:
        now = self.clock()
        table = Table.grid(padding=(0, 2))
        for phase, dur in self.durations():
            label = PHASE_LABEL.get(phase, phase)
            if dur is None and phase not in ("ready", "serving"):
                table.add_row(
                    Spinner("dots", style="cyan"),
                    Text(label, style="bold"),
                    Text(f"{now - self.phase_seen[phase]:.0f} s", style="cyan"),
                )
            else:
                table.add_row(
                    Text("✓", style="green"), Text(label), Text(f"{dur:.1f} s" if dur else "", style="dim")
                )
        if not self.phase_seen:
            table.add_row(
                Spinner("dots", style="cyan"),
                Text("waiting for the first line", style="bold"),
                Text(f"{now - self.started:.0f} s", style="cyan"),
            )
        parts: list[Any] = [table]
        obs = self.scanner.server.observed
        if obs.get("shards_total"):
            parts.append(
                Text(
                    f"  weights: shard {obs.get('shards_done', 0)}/{obs['shards_total']}"
                    + (f" ({obs['load_pct']}%)" if obs.get("load_pct") is not None else ""),
                    style="dim",
                )
            )
        if self.last_line:
            parts.append(Text(f"  last: {self.last_line[:160]}", style="dim"))
        return Group(*parts)


class PlainProgress:
    """Timestamped phase lines for a pipe or a file (no live redraw)."""

    def __init__(self, session: LiveSession, out: Any = None):
        self.session = session
        self.out = out or sys.stdout
        self.printed: set[str] = set()

    def update(self) -> None:
        s = self.session
        for phase, _t in sorted(s.phase_seen.items(), key=lambda kv: kv[1]):
            if phase not in self.printed:
                self.printed.add(phase)
                at, clock = s.since_start(phase)
                print(f"[{at:7.1f} s {clock}] ✓ {PHASE_LABEL.get(phase, phase)}", file=self.out, flush=True)

    def stop(self) -> None:
        self.update()


class RichProgress:
    def __init__(self, session: LiveSession, console: Console):
        self.session = session
        self.live = Live(session.renderable(), console=console, refresh_per_second=4, transient=True)
        self.live.start()

    def update(self) -> None:
        self.live.update(self.session.renderable())

    def stop(self) -> None:
        self.live.stop()


def make_progress(
    session: LiveSession, console: Console, json_out: bool = False
) -> PlainProgress | RichProgress:
    """A live view on a terminal, plain phase lines otherwise; on stderr when stdout carries JSON."""
    if json_out:
        return PlainProgress(session, out=sys.stderr)
    return RichProgress(session, console) if console.is_terminal else PlainProgress(session)
