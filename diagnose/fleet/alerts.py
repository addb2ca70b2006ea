"""The fleet's verdicts into the stack people already run: Prometheus metrics and
Alertmanager alerts, fed the events of `diagnose stream` (and the node agent).

Metrics (`--metrics-port`, scraped at /metrics; a registry of our own, so nothing else of
the process leaks in):
- `diagnose_source_status{source,namespace,pod,container,node,status}` 1 for each open source's
  current status (the old status's series is removed when it changes, and all of a source's
  when it closes: cardinality follows the open sources);
- `diagnose_findings_total{class,oom_phase}` failures and findings reported, by class;
- `diagnose_events_total{event}`; `diagnose_sources_open`.

Alerts (`--alertmanager URL`): a `failed` or `hang` event posts one alert to Alertmanager's v2
API (`POST /api/v2/alerts`; labels: alertname, class, phase, oom_phase, source, pod, namespace,
container, node; annotations: summary, evidence, change); a source that becomes ready again
resolves it (`endsAt`). A sender thread posts them, so a slow Alertmanager never stalls the
scan; when its queue is full the oldest alert waits no longer (counted, said at the end).
"""

from __future__ import annotations

import datetime as dt
import queue
import threading
from typing import Any

from ..model.records import Change
from ..outputs.text import change_text
from ..stream.session import Event

ALERT_QUEUE = 1024
POST_TIMEOUT_S = 5.0
_LABELS = ("source", "namespace", "pod", "container", "node")


class StreamMetrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        self.status = Gauge(
            "diagnose_source_status",
            "1 for the current status of each open source (failed, degraded, ready, incomplete)",
            [*_LABELS, "status"],
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
        self._status_of: dict[str, tuple[str, ...]] = {}

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve /metrics on a thread; the port bound (0: any free one)."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_port)

    def take(self, e: Event, open_sources: int) -> None:
        self.events.labels(e.kind).inc()
        if e.kind in ("failed", "finding", "hang") and e.finding is not None:
            self.findings.labels(e.finding.get("class") or "", e.finding.get("oom_phase") or "").inc()
        ident = tuple(e.source if k == "source" else e.labels.get(k, "") for k in _LABELS)
        old = self._status_of.pop(e.source, None)
        if old is not None:
            self.status.remove(*old)
        if e.kind != "closed":
            now = (*ident, "failed" if e.kind == "hang" else e.status)
            self.status.labels(*now).set(1)
            self._status_of[e.source] = now
        self.open.set(open_sources)


def _iso(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def alert_of(e: Event, now: dt.datetime, resolved: bool = False) -> dict[str, Any]:
    f = e.finding or {}
    labels = {
        "alertname": "InferenceServerHang" if e.kind == "hang" else "InferenceServerFailed",
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
    if resolved:
        alert["endsAt"] = _iso(now)
    return alert


class AlertPoster:
    """Alerts to Alertmanager's v2 API, posted by a thread of its own."""

    def __init__(self, url: str):
        import httpx

        self.url = url.rstrip("/") + "/api/v2/alerts"
        self._client = httpx.Client(timeout=POST_TIMEOUT_S)
        self._q: queue.Queue[list[dict[str, Any]] | None] = queue.Queue(maxsize=ALERT_QUEUE)
        self._firing: dict[str, dict[str, Any]] = {}  # source -> its alert, to resolve it
        self.sent = 0
        self.dropped = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def take(self, e: Event) -> None:
        now = dt.datetime.now(dt.UTC)
        if e.kind in ("failed", "hang") or (e.kind == "finding" and e.status == "failed"):
            alert = alert_of(e, now)
            self._firing[e.source] = alert
            self._put([alert])
        elif e.kind in ("ready", "closed") and e.source in self._firing and e.status != "failed":
            alert = self._firing.pop(e.source)
            self._put([{**alert, "endsAt": _iso(now)}])

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
        while True:
            alerts = self._q.get()
            if alerts is None:
                return
            try:
                r = self._client.post(self.url, json=alerts)
                if r.status_code >= 300:
                    self.errors.append(f"{self.url}: HTTP {r.status_code} {r.text[:200]}")
                else:
                    self.sent += len(alerts)
            except Exception as e:
                self.errors.append(f"{self.url}: {type(e).__name__}: {e}")

    def close(self, wait_s: float = POST_TIMEOUT_S * 2) -> None:
        """Post what is queued (within `wait_s`), then stop."""
        self._q.put(None)
        self._thread.join(wait_s)
        self._client.close()
