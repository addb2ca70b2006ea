"""How long the startup took, by the log's own clock: from the first phase of the last run to
ready (or to the last phase reached), and each phase until the next. None when the log prints
no times it can be read by (a watcher's wall clock is said as such where one is used)."""

from __future__ import annotations

import itertools

from ..model.records import PhaseMark
from ..read.clock import seconds

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any


def durations(timeline: list[PhaseMark]) -> dict[str, Any] | None:
    """{"clock": "log", "startup_s": start to ready (None when not ready), "elapsed_s": start to
    the last phase, "phases": [{"phase", "line", "s"}…]} for the last run; None without times."""
    starts = [i for i, m in enumerate(timeline) if m.phase == "start"]
    run = timeline[starts[-1] :] if starts else timeline
    timed = [(m, t) for m in run if (t := seconds(m.time)) is not None]
    if len(timed) < 2:
        return None
    first = timed[0][1]
    phases = []
    for (m, t), (_, t_next) in itertools.pairwise(timed):
        if t_next < t:  # a clock that went back (a day's wrap without a date): no figure
            return None
        phases.append({"phase": m.phase, "line": m.line, "s": round(t_next - t, 3)})
    ready = next((t for m, t in timed if m.phase == "ready"), None)
    return {
        "clock": "log",
        "startup_s": round(ready - first, 3) if ready is not None else None,
        "elapsed_s": round(timed[-1][1] - first, 3),
        "phases": phases,
    }


def said(d: dict[str, Any] | None) -> str | None:
    """ "ready in 4 min 05 s (by the log's timestamps; weights 2 min 10 s, …)" or None."""
    if not d:
        return None
    from ..model.taxonomy import TAXONOMY

    label = TAXONOMY.phase_label
    longest = sorted(d["phases"], key=lambda p: -p["s"])[:3]
    each = ", ".join(f"{label.get(p['phase'], p['phase'])} {span(p['s'])}" for p in longest if p["s"] >= 1)
    head = (
        f"ready in {span(d['startup_s'])}" if d["startup_s"] is not None else f"{span(d['elapsed_s'])} so far"
    )
    return head + " by the log's timestamps" + (f" (longest: {each})" if each else "")


def span(s: float) -> str:
    if s < 60:
        return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
    m, sec = divmod(round(s), 60)
    if m < 60:
        return f"{m} min {sec:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"
