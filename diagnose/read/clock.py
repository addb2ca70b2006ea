"""The log's clock: a timestamp as printed, as seconds on one axis.

Logs print many shapes of time (ISO, vLLM's month-day, TRT-LLM's month/day/year, a bare
hour); the timeline, the merge of several logs and the serving series compare them here.
"""

from __future__ import annotations

import re

_TS_PATTERNS = [
    (re.compile(r"^(\d{4})[-/](\d{2})[-/](\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?"), "ymd"),
    (re.compile(r"^(\d{2})/(\d{2})/(\d{4})-(\d{2}):(\d{2}):(\d{2})()"), "mdy"),
    (re.compile(r"^(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"), "md"),
    (re.compile(r"^(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?$"), "hms"),
]


def seconds(ts: str | None) -> float | None:
    """A log timestamp as seconds on one axis (year 2000 when the log prints none)."""
    if not ts:
        return None
    for pat, kind in _TS_PATTERNS:
        m = pat.match(ts)
        if not m:
            continue
        g = [int(x) if x and i < len(m.groups()) - 1 else x for i, x in enumerate(m.groups())]
        if kind == "ymd":
            return _civil_seconds(g[0], g[1], g[2], g[3], g[4], g[5])
        if kind == "mdy":
            return _civil_seconds(g[2], g[0], g[1], g[3], g[4], g[5])
        if kind == "md":
            return _civil_seconds(2000, g[0], g[1], g[2], g[3], g[4])
        return g[0] * 3600 + g[1] * 60 + g[2]
    return None


_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _civil_seconds(y: int, mo: int, d: int, h: int, mi: int, s: int) -> float | None:
    """Seconds since 1970 of a calendar time (one axis for the log's clock; no time zone, no
    `datetime` import on the scan path); None for a date no calendar has."""
    if not (1 <= mo <= 12 and 1 <= d <= _MONTH_DAYS[mo - 1] and h < 24 and mi < 60 and s < 61):
        return None
    y -= mo <= 2  # days from civil (H. Hinnant): March-based years
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (mo + (-3 if mo > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468
    return float(days * 86400 + h * 3600 + mi * 60 + s)
