"""The serving phase: the engines' periodic stats lines as a time series, and what they say.

The scanner keeps a bounded sample of the stats lines (`SeriesSampler`: at most SAMPLE_MAX
points however long the log, every k-th line with k doubling as it fills, and always the
latest); this module reads them with the detected engine's `series` markers and turns them
into a summary and a verdict:

- `kv_bound`: the KV cache ≥ 90 % full in most active points while requests queue
  (or the engine does not print its queue) → more KV cache, fewer concurrent sequences;
- `preemption_storm`: the engine keeps preempting (V1 `Preemptions: N`) → the same;
- `throughput_collapse`: generation per running request falls to a fraction of what the
  same log showed earlier, with the batch not smaller (long contexts, thrashing);
- `scheduler_bound`: running pinned at max_num_seqs, KV to spare, a queue → raise the cap;
- `client_bound`: no queue, a small batch, KV idle → the client, not the server, is the limit;
- `healthy`, `idle` (no request in any point), `unknown` (too few points to say).

Only `kv_bound` and `preemption_storm` (and a collapse under a full KV cache) become a
finding (class `preemption`, a warning): the others are told in the `serving` object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise

from ..read.clock import seconds

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

    from ..read.prefixes import Layout

SAMPLE_MAX = 600  # points kept per scan: flat memory on a week of stats lines
LINE_MAX = 2000  # bytes kept of one stats line
READINGS_KEPT = 64  # stats lines a live scan keeps read between diagnoses (its memory stays flat)
MIN_POINTS = 3  # fewer active points say nothing about a trend
KV_FULL = 0.9  # usage at which the engines start to preempt / retract
KV_FULL_SHARE = 0.6  # share of active points that must be that full
KV_PERSIST_S = 30  # a full cache with a queue for less than this is one long request passing
KV_PERSIST_POINTS = 5  # the same, counted in stats lines, when the log prints no times
KV_SPARE = 0.8  # below this, KV is not what bounds the batch
STORM_PREEMPTIONS = 10  # preemptions over the log (V1 prints a count per interval)
COLLAPSE_RATIO = 0.4  # per-request generation that fell to this share of its earlier level
CLIENT_BATCH = 4  # at most this many running requests with no queue: the client is the limit
CHART_WIDTH = 60


def median(vals: list[float]) -> float:
    """The middle value (statistics.median costs an import of decimal and fractions at start)."""
    s = sorted(vals)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


class SeriesSampler:
    """Every stride-th stats line, at most SAMPLE_MAX of them: when full, every other point is
    dropped and the stride doubles, so the sample stays spread over the whole log."""

    __slots__ = ("latest", "points", "read", "seen", "stride")

    def __init__(self) -> None:
        self.points: list[tuple[str, int, bytes]] = []
        self.seen = 0
        self.stride = 1
        self.latest: tuple[str, int, bytes] | None = None
        self.read: dict[Any, Any] = {}  # read_points' cache of the lines read so far

    def take(self) -> bool:
        """Count one more stats line; whether the sample wants it (then `keep` it)."""
        self.seen += 1
        return not (self.seen - 1) % self.stride

    def keep(self, source: str, line: int, raw: bytes) -> None:
        self.points.append((source, line, raw[:LINE_MAX]))
        if len(self.points) >= SAMPLE_MAX:
            self.points = self.points[::2]
            self.stride *= 2

    def last(self, source: str, line: int, raw: bytes) -> None:
        """The latest stats line so far (kept whatever the stride: the state the log ends in)."""
        self.latest = (source, line, raw[:LINE_MAX])

    def collect(self, block: bytes, base: int, source: str, needles: list[bytes]) -> None:
        """Count every stats line of the block (`base`: the lines before it); read the line
        number and bytes only of those the sample keeps, and of the block's latest (a serving
        log is one stats line in ten)."""
        # every wording's matches in one Aho-Corasick pass (in the log's order), then one point
        # a line: its first match (vLLM V0 says "KV cache usage:" for GPU and CPU)
        matches = _matcher(tuple(needles)).find_matches_as_indexes(block)
        if not matches:
            return
        starts = [m[1] for m in matches]
        hits = [starts[0]] + [b for a, b in pairwise(starts) if block.find(b"\n", a, b) >= 0]
        n = len(block)
        counted, line = 0, base

        def read(at: int) -> tuple[int, bytes]:
            nonlocal counted, line
            start = block.rfind(b"\n", 0, at) + 1
            line += block.count(b"\n", counted, start)
            counted = start
            nl = block.find(b"\n", at)
            return line + 1, block[start : n if nl < 0 else nl]

        # the hits `take` would want, by arithmetic: hit i is the stats line seen0 + i + 1, kept
        # where (seen0 + i) % stride is 0, with the stride as it stands after each keep
        seen0, i = self.seen, -self.seen % self.stride
        while i < len(hits):
            self.keep(source, *read(hits[i]))
            i += 1
            i += -(seen0 + i) % self.stride
        self.seen = seen0 + len(hits)
        number, raw = read(hits[-1])
        self.last(source, number, raw)

    def snapshot(self) -> list[tuple[str, int, bytes]]:
        out = list(self.points)
        if self.latest is not None and (not out or out[-1] != self.latest):
            out.append(self.latest)
        return out


@dataclass(slots=True)
class Point:
    """One stats line read as numbers."""

    source: str
    line: int
    time: str | None
    values: dict[str, float]
    text: str
    replica: str = ""  # a data-parallel engine's own stats ("Engine 001", "DP1"); "" for one


@dataclass(slots=True)
class Serving:
    """The verdict on the serving phase, with the points it stands on."""

    verdict: str
    why: str
    points: list[Point]
    seen: int  # stats lines in the log (the points are a sample of them)
    evidence: Point | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    next_step: str | None = None  # for the verdicts that are not a finding

    @property
    def degraded(self) -> bool:
        # a collapse is KV pressure only when the cache was full where it collapsed (its title
        # says so); elsewhere it is told with a next step, not a finding
        return self.verdict in ("kv_bound", "preemption_storm") or (
            self.verdict == "throughput_collapse"
            and self.evidence is not None
            and self.evidence.values.get("kv_usage", 0) >= KV_FULL
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "why": self.why,
            "next_step": self.next_step,
            "stats_lines": self.seen,
            "evidence": _where(self.evidence),
            "summary": self.summary,
            "series": [
                {"line": p.line, "time": p.time, **{k: _round(v) for k, v in sorted(p.values.items())}}
                for p in self.points
            ],
        }


def _where(p: Point | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {"source": p.source, "line": p.line, "text": p.text}


def _round(v: float) -> float | int:
    return int(v) if v == int(v) else round(v, 4)


def series_needles(profiles: Any) -> list[bytes]:
    """The needles of the engines' periodic stats lines, each found once: a needle holding
    another one ("GPU KV cache usage:" and "KV cache usage:") finds no more lines."""
    needles = {n.encode("utf-8") for s in profiles.series for n in s.needles}
    return sorted(n for n in needles if not any(m != n and m in n for m in needles))


def read_points(
    raw: list[tuple[str, int, bytes]],
    markers: list[Any],
    layout: Layout,
    since_line: int = 0,
    cache: dict[Any, Any] | None = None,
) -> list[Point]:
    """The sampled stats lines read with the engine's markers (the first whose needle is in the
    line reads it: vLLM's and LMDeploy's lines share a wording). Lines of an earlier run of the
    server are left out. `cache`: the readings of earlier calls on the same scan's lines, by the
    markers' order (those of the first READINGS_KEPT lines sampled now are kept)."""
    layout = layout.fresh()
    order = tuple(id(mk) for mk in markers)  # another engine detected since: another reading
    kept: dict[Any, Any] = {}  # the readings of the lines sampled now
    out: list[Point] = []
    for source, number, data in raw:
        if number < since_line:
            continue
        key = (order, source, number)  # a scan's line: the same bytes every time it is sampled
        reading = cache.get(key, _UNREAD) if cache is not None else _UNREAD
        if reading is _UNREAD:
            reading = _reading(layout.line(source, number, data), markers)
        if len(kept) < READINGS_KEPT:
            kept[key] = reading
        if reading is not None:
            when, values, text, replica = reading
            out.append(Point(source, number, when, dict(values), text, replica))
    if cache is not None:
        cache.clear()
        cache.update(kept)
    return out


_UNREAD = object()


def _reading(line: Any, markers: list[Any]) -> tuple[str | None, dict[str, float], str, str] | None:
    """One stats line as (time, values, text, replica), or None where no marker reads it."""
    text = line.message
    for mk in markers:
        if any(n in text for n in mk.needles):
            values = mk.read(text)
            if not values:
                return None
            m = _REPLICA.search(text) or _REPLICA.search(line.process or "")
            replica = (f"engine {m.group(1)}" if m.group(1) else f"DP{m.group(2)}") if m else ""
            return line.timestamp, values, text.strip()[:300], replica
    return None


# vLLM V1 "Engine 001: …" (not "2 Engines Aggregated"), SGLang's "[… DP1 TP0]" tag
_REPLICA = re.compile(r"\bEngine (\d{3}):|\bDP(\d+)\b")
# the order in which a replica's verdict speaks for the whole server
SEVERITY = [
    "preemption_storm",
    "kv_bound",
    "throughput_collapse",
    "scheduler_bound",
    "healthy",
    "client_bound",
    "unknown",
    "idle",
]


def judge_replicas(points: list[Point], seen: int, max_num_seqs: int | None) -> Serving | None:
    """Data-parallel engines each print their own stats: each is judged on its own lines (a
    mixed series would dilute one full replica among idle ones); the worst verdict speaks."""
    groups: dict[str, list[Point]] = {}
    for p in points:
        groups.setdefault(p.replica, []).append(p)
    if len(groups) <= 1:
        return judge(points, seen, max_num_seqs)
    verdicts = [(name, judge(pts, len(pts), max_num_seqs)) for name, pts in sorted(groups.items())]
    name, worst = min(
        ((n, v) for n, v in verdicts if v is not None), key=lambda nv: SEVERITY.index(nv[1].verdict)
    )
    worst.seen = seen
    worst.summary["replicas"] = {n or "aggregate": v.verdict for n, v in verdicts if v is not None}
    if name:
        worst.why = f"{name}: {worst.why}"
    return worst


def _values(points: list[Point], key: str) -> list[float]:
    return [p.values[key] for p in points if key in p.values]


def _stats(vals: list[float]) -> dict[str, float | int] | None:
    if not vals:
        return None
    return {
        "min": _round(min(vals)),
        "median": _round(median(vals)),
        "max": _round(max(vals)),
        "last": _round(vals[-1]),
    }


def _active(p: Point) -> bool:
    v = p.values
    return (
        v.get("running", 0) > 0
        or v.get("waiting", 0) > 0
        or v.get("gen_tps", 0) > 0
        or v.get("prompt_tps", 0) > 0
    )


# One verdict: its name, why, the stats line it stands on, the next step (when one).
Verdict = tuple[str, str, "Point | None", "str | None"]


def judge(points: list[Point], seen: int, max_num_seqs: int | None) -> Serving | None:
    """The verdict on a run's stats lines; None when the log has none. The first of the
    verdicts below that holds is it; healthy when none does."""
    if not points:
        return None
    active = [p for p in points if _active(p)]
    summary = _summary(points, active)
    v: Verdict | None
    if not active:
        v = ("idle", "no request was running or waiting in any stats line", points[-1], None)
    elif len(active) < MIN_POINTS:
        v = ("unknown", f"only {len(active)} stats line(s) with requests in flight", active[-1], None)
    else:
        kv = [p for p in active if "kv_usage" in p.values]
        summary["kv_full_share"] = round(_full_share(kv), 2)
        v = next(
            (
                found
                for check in (_storm, _kv_bound, _slowdown, _scheduler_bound, _client_bound)
                if (found := check(active, kv, summary, max_num_seqs)) is not None
            ),
            None,
        )
        if v is None:
            peak = _peak(kv)
            why = "no sustained KV pressure, queue or preemption in the stats lines"
            v = ("healthy", why, peak or active[-1], None)
    name, why, evidence, next_step = v
    return Serving(name, why, points, seen, evidence, summary, next_step)


def _summary(points: list[Point], active: list[Point]) -> dict[str, Any]:
    summary: dict[str, Any] = {"points": len(points), "active_points": len(active)}
    for key in ("running", "waiting", "kv_usage", "gen_tps", "prompt_tps", "prefix_hit"):
        s = _stats(_values(points, key))
        if s is not None:
            summary[key] = s
    preempted = sum(_values(points, "preemptions"))
    if preempted:
        summary["preemptions"] = _round(preempted)
    if points[0].time or points[-1].time:
        summary["from"], summary["to"] = points[0].time, points[-1].time
    return summary


def _full(kv: list[Point]) -> list[Point]:
    return [p for p in kv if p.values["kv_usage"] >= KV_FULL]


def _full_share(kv: list[Point]) -> float:
    return len(_full(kv)) / len(kv) if kv else 0.0


def _peak(kv: list[Point]) -> Point | None:
    return max(kv, key=lambda p: (p.values["kv_usage"], p.values.get("waiting", 0))) if kv else None


def _storm(active: list[Point], kv: list[Point], summary: dict[str, Any], cap: int | None) -> Verdict | None:
    """V1 counts preemptions per interval; a handful over hours is the scheduler doing its job."""
    preempted = summary.get("preemptions", 0)  # over every stats line of the run
    with_preemptions = [p for p in active if p.values.get("preemptions", 0) > 0]
    if preempted < STORM_PREEMPTIONS or len(with_preemptions) < 2:
        return None
    worst = max(with_preemptions, key=lambda p: p.values["preemptions"])
    return (
        "preemption_storm",
        f"{preempted} preemptions over {len(with_preemptions)} stats lines: the KV cache "
        "cannot hold the running batch, requests are evicted and recomputed",
        worst,
        None,
    )


def _kv_bound(
    active: list[Point], kv: list[Point], summary: dict[str, Any], cap: int | None
) -> Verdict | None:
    full = _full(kv)
    queue_known = any("waiting" in p.values for p in active)
    pressed = [p for p in full if p.values.get("waiting", 0) > 0] if queue_known else full
    if not (
        len(kv) >= MIN_POINTS
        and _full_share(kv) >= KV_FULL_SHARE
        and len(pressed) >= len(full) / 2
        and _persists(pressed)
    ):
        return None
    waiting = _values(full, "waiting")
    queue = (
        f", {int(median(waiting))} requests waiting (median)" if waiting else " (the line has no queue count)"
    )
    return (
        "kv_bound",
        f"the KV cache was ≥ {KV_FULL:.0%} full in {len(full)} of {len(kv)} stats lines{queue}: "
        "memory, not compute, bounds the batch",
        _peak(kv) or full[-1],
        None,
    )


def _slowdown(
    active: list[Point], kv: list[Point], summary: dict[str, Any], cap: int | None
) -> Verdict | None:
    collapse = _collapse(active)
    if collapse is None:
        return None
    before, after, at = collapse
    summary["per_request_tps"] = {"before": round(before, 2), "after": round(after, 2)}
    kv_at = at.values.get("kv_usage")
    tail = f", KV cache {kv_at:.0%} full" if kv_at is not None else ""
    return (
        "throughput_collapse",
        f"generation per running request fell from {before:.1f} to {after:.1f} tokens/s with the "
        f"batch no smaller{tail}",
        at,
        "look at the prompts' lengths and the KV cache: long contexts or a cache that thrashes"
        if kv_at is None or kv_at < KV_FULL
        else None,
    )


def _spare(kv: list[Point]) -> bool:
    return not kv or max(p.values["kv_usage"] for p in kv) < KV_SPARE


def _scheduler_bound(
    active: list[Point], kv: list[Point], summary: dict[str, Any], cap: int | None
) -> Verdict | None:
    if not (cap and _values(active, "running")):
        return None
    pinned = [p for p in active if p.values.get("running", 0) >= cap and p.values.get("waiting", 0) > 0]
    if len(pinned) < max(MIN_POINTS, len(active) / 2) or not _spare(kv):
        return None
    return (
        "scheduler_bound",
        f"{cap} requests running (the max_num_seqs cap) with requests waiting "
        f"in {len(pinned)} stats lines while the KV cache had room",
        pinned[-1],
        f"raise max_num_seqs above {cap}: the KV cache has room for more",
    )


def _client_bound(
    active: list[Point], kv: list[Point], summary: dict[str, Any], cap: int | None
) -> Verdict | None:
    running = _values(active, "running")
    queue_known = any("waiting" in p.values for p in active)
    if not (running and _spare(kv) and queue_known and not any(_values(active, "waiting"))):
        return None
    if max(running) > CLIENT_BATCH:
        return None
    usage = f"at most {max(p.values['kv_usage'] for p in kv):.0%}" if kv else "unreported"
    return (
        "client_bound",
        f"at most {int(max(running))} requests in flight, none waiting, KV cache {usage}: "
        "the server had room for more",
        active[-1],
        "raise the client's concurrency (more parallel requests) before tuning the server",
    )


def _persists(points: list[Point]) -> bool:
    """Whether a condition lasted: KV_PERSIST_S of the log's time, or KV_PERSIST_POINTS lines."""
    t0, t1 = seconds(points[0].time), seconds(points[-1].time) if points else None
    if t0 is not None and t1 is not None:
        return t1 - t0 >= KV_PERSIST_S
    return len(points) >= KV_PERSIST_POINTS


def _collapse(active: list[Point]) -> tuple[float, float, Point] | None:
    """Per-request generation in the last third against the best third before it, over the
    points with a steady batch: the engines average throughput over an interval but count
    running requests at its end, so a bursty load's small batches say nothing."""
    pts = [p for p in active if p.values.get("gen_tps", 0) > 0 and p.values.get("running", 0) > CLIENT_BATCH]
    if len(pts) < 3 * MIN_POINTS:
        return None
    rate = [p.values["gen_tps"] / p.values["running"] for p in pts]
    third = len(pts) // 3
    thirds = [rate[:third], rate[third : 2 * third], rate[2 * third :]]
    before = max(median(thirds[0]), median(thirds[1]))
    after = median(thirds[2])
    run_before = median([p.values["running"] for p in pts[: 2 * third]])
    run_after = median([p.values["running"] for p in pts[2 * third :]])
    if before > 0 and after < COLLAPSE_RATIO * before and run_after >= run_before:
        return before, after, pts[2 * third + len(thirds[2]) // 2]
    return None


def chart(s: Serving, width: int = CHART_WIDTH) -> list[str]:
    """Two text rows over the sampled run: KV usage and the queue, one block character per
    bucket of points (for a terminal; pipes get the numbers)."""
    bars = " ▁▂▃▄▅▆▇█"
    pts = s.points
    if len(pts) < 2:
        return []
    buckets = [pts[i * len(pts) // width : (i + 1) * len(pts) // width] for i in range(min(width, len(pts)))]
    rows = []
    kv = [max((p.values.get("kv_usage", -1) for p in b), default=-1) for b in buckets]
    if any(v >= 0 for v in kv):
        rows.append(
            "KV cache "
            + "".join(" " if v < 0 else bars[min(8, round(v * 8))] for v in kv)
            + f" max {max(kv):.0%}"
        )
    queue = [max((p.values.get("waiting", -1) for p in b), default=-1) for b in buckets]
    top = max(queue)
    if top > 0:
        rows.append(
            "queue    "
            + "".join(" " if v < 0 else bars[min(8, round(v / top * 8))] for v in queue)
            + f" max {int(top)}"
        )
    return rows


@lru_cache(maxsize=8)
def _matcher(needles: tuple[bytes, ...]) -> Any:
    """The stats lines' wordings as one Aho-Corasick automaton (its prefilter runs at GB/s on a
    handful of needles, where one `bytes.find` sweep a wording read the block four times)."""
    import ahocorasick_rs

    return ahocorasick_rs.BytesAhoCorasick(list(needles))
