"""A phase that has not finished: the hang finding when a finished log stops in a phase past its
budget, the live one while watching, and the latest phase reached.
"""

from __future__ import annotations

from ..match.scanner import ScanResult
from ..model.records import PHASE_INDEX, Finding, PhaseMark
from ..model.taxonomy import TAXONOMY
from ..read.clock import seconds

# Time a phase may take before a scan of a finished log calls it a hang (seconds), and what
# it usually waits on (rules/taxonomy/taxonomy.yaml).
HANG_BUDGET_S = TAXONOMY.hang_budget_s
HANG_WAITS_ON = TAXONOMY.waits_on


def hang_finding(result: ScanResult, timeline: list[PhaseMark]) -> Finding | None:
    """A finished log whose last phase ran past its budget with no error: stuck there."""
    if not timeline or "ready" in {m.phase for m in timeline}:
        return None
    last = latest_mark(timeline)
    budget = HANG_BUDGET_S.get(last.phase)
    t0, t1 = seconds(last.time), seconds(result.last_time)
    if budget is None or t0 is None or t1 is None or t1 - t0 <= budget:
        return None
    return Finding(
        rule="generic.hang",
        cls="hang",
        severity="error",
        title=f"No progress in {last.phase} for {int(t1 - t0)} s (budget {budget} s)",
        line=last.line,
        source=last.source,
        evidence=last.text,
        phase_at=last.phase,
        time=last.time,
        facts={"phase": last.phase, "stuck_s": int(t1 - t0), "budget_s": budget},
        note=f"this phase usually waits on {HANG_WAITS_ON.get(last.phase, 'I/O')}",
    )


def live_hang_finding(
    timeline: list[PhaseMark], phase: str, stuck: float, budget: float, source: str, line: int, last_line: str
) -> Finding:
    """A phase with no progress for longer than its budget while the log is followed (`watch`,
    `run`, a stream's session): `line` and `last_line` stand in when the phase has no mark."""
    mark = next((m for m in timeline if m.phase == phase), None)
    return Finding(
        rule="live.hang",
        cls="hang",
        severity="fatal",
        title=f"No progress in {TAXONOMY.phase_label.get(phase, phase)} for {int(stuck)} s (budget {int(budget)} s)",
        line=mark.line if mark else line,
        source=source,
        evidence=last_line or (mark.text if mark else "(no output yet)"),
        phase_at=phase,
        facts={"phase": phase, "stuck_s": int(stuck), "budget_s": int(budget)},
        note=f"this phase usually waits on {HANG_WAITS_ON.get(phase, 'I/O')}",
    )


def latest_mark(timeline: list[PhaseMark]) -> PhaseMark:
    """The phase the log reached last. Engines name their first phases in different orders (a
    V1 log names its platform before its arguments: stopped after the arguments, it is in
    `args`, not in `devices`), so those go by the log's order; once the startup is past
    distributed init, a late echo of an early marker does not move it back."""
    last = timeline[-1]  # in the order the log reached them
    furthest = max(timeline, key=lambda m: PHASE_INDEX[m.phase])
    if PHASE_INDEX[furthest.phase] >= PHASE_INDEX["distributed_init"]:
        return furthest if PHASE_INDEX[last.phase] < PHASE_INDEX[furthest.phase] else last
    return last


def last_phase(timeline: list[PhaseMark]) -> str | None:
    if not timeline:
        return None
    return latest_mark(timeline).phase
