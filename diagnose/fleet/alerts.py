"""The fleet's verdicts into the stack people already run: Prometheus metrics and
Alertmanager alerts, fed the events of `diagnose stream` (and the node agent).

Metrics (`--metrics-port`, scraped at /metrics; a registry of our own, so nothing else of
the process leaks in; no `_created` series, no empty label — "none" says none):
- `diagnose_source_status{source,namespace,pod,container,node,status,class}` 1 for each
  source's current status. A source closed while failed keeps its series (a crashed pod goes
  quiet: its alert must not resolve itself) until the source is gone (its file removed);
  others' series go when they close, so cardinality follows the sources;
- `diagnose_findings_total{class,oom_phase}`, `diagnose_events_total{event}`,
  `diagnose_sources_open`;
- `diagnose_startup_seconds` (histogram): start to ready by the log's own timestamps;
  `diagnose_phase_seconds{phase}` (histogram): each startup phase until the next;
- `diagnose_build_info{version}` 1.

Alerts (`--alertmanager URL`, Alertmanager's v2 API `POST /api/v2/alerts`): a `failed` or
`hang` event fires an alert (labels: alertname, severity, class, phase, oom_phase, source,
pod, namespace, container, node; annotations: summary, evidence, change). A firing alert is
re-posted every `repost_s` with `endsAt` three periods ahead, so Alertmanager keeps it active
whatever its `resolve_timeout`, until the source is ready again (resolved at once) or gone; a
source that closes while failed stays firing. A sender thread posts them, so a slow
Alertmanager never stalls the scan; when its queue is full the oldest post waits no longer
(counted, said at the end).
"""

from __future__ import annotations

import datetime as dt
import itertools
import queue
import threading
import time
from typing import Any

from ..model.records import Change
from ..outputs.text import change_text
from ..read.clock import seconds
from ..stream.session import Event

ALERT_QUEUE = 1024
POST_TIMEOUT_S = 5.0
REPOST_S = 60.0  # well inside Alertmanager's default resolve_timeout (5 min)
_LABELS = ("source", "namespace", "pod", "container", "node")
NONE = "none"  # a label with nothing to say (an empty value reads as a missing label)
# startup and phase durations, seconds: a small model in seconds to a large one over an hour
BUCKETS = (5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)


class StreamMetrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

        from .. import __version__

        disable_created_metrics()  # counters and histograms without their `_created` series
        self.registry = CollectorRegistry()
        self.status = Gauge(
            "diagnose_source_status",
            "1 for the current status of each source (failed, degraded, ready, incomplete, "
            "not_inference_server) and the class of its primary finding",
            [*_LABELS, "status", "class"],
            registry=self.registry,
        )
        self.findings = Counter(
            "diagnose_findings",
            "Failures and findings reported, by class and OOM phase",
            ["class", "oom_phase"],
            registry=self.registry,
        )
        self.events = Counter("diagnose_events", "Events by kind", ["event"], registry=self.registry)
        self.open = Gauge("diagnose_sources_open", "Sources followed now", registry=self.registry)
        self.startup = Histogram(
            "diagnose_startup_seconds",
            "Start to ready, by the log's own timestamps",
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.phases = Histogram(
            "diagnose_phase_seconds",
            "Each startup phase until the next, by the log's own timestamps",
            ["phase"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        info = Gauge("diagnose_build_info", "The diagnose build", ["version"], registry=self.registry)
        info.labels(__version__).set(1)
        self._status_of: dict[str, tuple[str, ...]] = {}

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve /metrics on a thread; the port bound (0: any free one)."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_port)

    def take(self, e: Event, open_sources: int) -> None:
        self.events.labels(e.kind).inc()
        f = e.finding or {}
        if e.kind in ("failed", "finding", "hang") and e.finding is not None:
            self.findings.labels(f.get("class") or NONE, f.get("oom_phase") or NONE).inc()
        if e.kind == "ready":
            self._durations(e)
        ident = tuple(e.source if k == "source" else e.labels.get(k) or NONE for k in _LABELS)
        status = "failed" if e.kind == "hang" else e.status
        old = self._status_of.pop(e.source, None)
        keep = e.kind != "closed" or (status == "failed" and not e.gone)
        now = (*ident, status, f.get("class") or NONE)
        if old is not None and not (keep and old == now):
            self.status.remove(*old)
        if keep:
            self.status.labels(*now).set(1)
            self._status_of[e.source] = now
        self.open.set(open_sources)

    def _durations(self, e: Event) -> None:
        """Start to ready and each phase, from the times the log printed (none: nothing said)."""
        d = e.diagnosis
        if d is None:
            return
        marks = [(m.phase, seconds(m.time)) for m in d.timeline]
        timed = [(phase, t) for phase, t in marks if t is not None]
        if len(timed) < 2:
            return
        for (phase, t0), (_, t1) in itertools.pairwise(timed):
            if t1 >= t0:
                self.phases.labels(phase).observe(t1 - t0)
        ready = next((t for phase, t in reversed(timed) if phase == "ready"), None)
        if ready is not None and ready >= timed[0][1]:
            self.startup.observe(ready - timed[0][1])


def _iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def alert_of(e: Event, now: dt.datetime) -> dict[str, Any]:
    f = e.finding or {}
    labels = {
        "alertname": "InferenceServerHang" if e.kind == "hang" else "InferenceServerFailed",
        "severity": "warning" if e.kind == "hang" else "critical",
        "class": f.get("class") or "",
        "phase": e.phase or "",
        "oom_phase": f.get("oom_phase") or "",
        "source": e.source,
        **{k: e.labels[k] for k in ("pod", "namespace", "container", "node") if e.labels.get(k)},
    }
    # the report's wording of a change, on one line
    said = " ".join(change_text(Change.from_json(e.change)).split()) if e.change else ""
    alert: dict[str, Any] = {
        "labels": {k: v for k, v in labels.items() if v},
        "annotations": {
            "summary": f.get("title") or e.status,
            "evidence": f"line {f.get('line')}: {f.get('evidence') or ''}"[:1000],
            "change": said,
        },
        "startsAt": _iso(now),
    }
    return alert


class AlertPoster:
    """Alerts to Alertmanager's v2 API, posted (and re-posted while firing) by a thread of its own."""

    def __init__(self, url: str, repost_s: float = REPOST_S):
        import httpx

        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.repost_s = repost_s
        self._client = httpx.Client(timeout=POST_TIMEOUT_S)
        self._q: queue.Queue[list[dict[str, Any]] | None] = queue.Queue(maxsize=ALERT_QUEUE)
        self._lock = threading.Lock()
        self._firing: dict[str, dict[str, Any]] = {}  # source -> its alert, re-posted until resolved
        self.sent = 0
        self.dropped = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def take(self, e: Event) -> None:
        now = dt.datetime.now(dt.UTC)
        fires = e.kind in ("failed", "hang") or (e.kind == "finding" and e.status == "failed")
        with self._lock:
            before = self._firing.get(e.source)
            if fires:
                alert = alert_of(e, now)
                if before is not None and before["labels"] == alert["labels"]:
                    alert["startsAt"] = before["startsAt"]  # the same alert, still firing
                elif before is not None:  # another failure now: that alert ends, this one fires
                    self._put([{**before, "endsAt": _iso(now)}])
                self._firing[e.source] = alert
                self._put([self._ahead(alert, now)])
            elif before is not None and self._ends(e):
                del self._firing[e.source]
                self._put([{**before, "endsAt": _iso(now)}])

    @staticmethod
    def _ends(e: Event) -> bool:
        """Ready again, or gone; a source that closes while failed stays firing."""
        if e.kind == "ready":
            return True
        return e.kind == "closed" and (e.gone or e.status != "failed")

    def _ahead(self, alert: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
        """The alert with `endsAt` three re-post periods ahead: active however long
        Alertmanager's resolve_timeout, and ending by itself if diagnose stops re-posting."""
        return {**alert, "endsAt": _iso(now + dt.timedelta(seconds=3 * self.repost_s))}

    def _put(self, alerts: list[dict[str, Any]]) -> None:
        try:
            self._q.put_nowait(alerts)
        except queue.Full:
            try:
                self._q.get_nowait()  # the oldest waits no longer
                self.dropped += 1
            except queue.Empty:
                pass
            self._q.put_nowait(alerts)

    def _run(self) -> None:
        due = time.monotonic() + self.repost_s
        while True:
            try:
                alerts = self._q.get(timeout=max(0.05, due - time.monotonic()))
            except queue.Empty:
                alerts = []
            if alerts is None:
                return
            if time.monotonic() >= due:  # the firing ones again, their endsAt moved ahead
                due = time.monotonic() + self.repost_s
                now = dt.datetime.now(dt.UTC)
                with self._lock:
                    alerts = alerts + [self._ahead(a, now) for a in self._firing.values()]
            if alerts:
                self._post(alerts)

    def _post(self, alerts: list[dict[str, Any]]) -> None:
        try:
            r = self._client.post(self.url, json=alerts)
            if r.status_code >= 300:
                self.errors.append(f"{self.url}: HTTP {r.status_code} {r.text[:200]}")
            else:
                self.sent += len(alerts)
        except Exception as e:
            self.errors.append(f"{self.url}: {type(e).__name__}: {e}")

    def close(self, wait_s: float = POST_TIMEOUT_S * 2) -> None:
        """Post what is queued (within `wait_s`), then stop; firing alerts keep their `endsAt`."""
        self._q.put(None)
        self._thread.join(wait_s)
        self._client.close()
