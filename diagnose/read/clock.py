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


def utc_time(raw: str | int | None) -> str | None:
    """A record's time as ISO-8601 UTC ("…Z"): RFC 3339 text, or an epoch count of seconds,
    milliseconds, microseconds (journald) or nanoseconds (OTLP, Loki) told by its digits.
    Worked out only for the records an event names (cheap input stays cheap)."""
    import datetime as dt

    if raw is None or raw == "":
        return None
    text = str(raw).strip()
    try:
        if text.isdigit():
            n = int(text)
            scale = 1e9 if len(text) >= 18 else 1e6 if len(text) >= 15 else 1e3 if len(text) >= 12 else 1.0
            when = dt.datetime.fromtimestamp(n / scale, dt.UTC)
        else:
            m = re.match(r"^(.*?T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)?$", text)
            if not m:
                return None
            frac = (m.group(2) or "")[:7]  # microseconds at most
            when = dt.datetime.fromisoformat(m.group(1) + frac + (m.group(3) or "Z").replace("Z", "+00:00"))
        return when.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (ValueError, OverflowError, OSError):
        return None
