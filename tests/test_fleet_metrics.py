"""The fleet's metrics as the exporter writes them, fed the events of real fixture logs: a
failed source's series outlives its silence (not its removal), the status names its class,
startup and phase durations come from the log's own timestamps, no `_created` series and no
empty label; and the Grafana dashboard in docs/ asks only for series the exporter writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from diagnose.fleet.alerts import StreamMetrics
from diagnose.stream import Sessions

from .conftest import FIXTURES, ROOT

VLLM = FIXTURES / "logs" / "vllm"


def _feed(metrics: StreamMetrics, sessions: Sessions, source: str, log: Path) -> None:
    for line in log.read_text(encoding="utf-8").splitlines():
        for e in sessions.feed_line(source, line, {"pod": source, "namespace": "llm"}):
            metrics.take(e, len(sessions))
    for e in sessions.get(source).tick() if sessions.get(source) else []:
        metrics.take(e, len(sessions))


def _samples(metrics: StreamMetrics) -> list[tuple[str, dict[str, str], float]]:
    text = generate_latest(metrics.registry).decode()
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def _exercised() -> tuple[StreamMetrics, Sessions]:
    metrics, sessions = StreamMetrics(), Sessions()
    _feed(metrics, sessions, "vllm-ok", VLLM / "healthy-v1-serving.log")
    _feed(metrics, sessions, "vllm-oom", VLLM / "kv-cache-too-small-v1.log")
    return metrics, sessions


def test_a_failed_source_keeps_its_series_when_quiet_and_loses_it_when_gone() -> None:
    metrics, sessions = _exercised()
    for e in sessions.close("vllm-oom") + sessions.close("vllm-ok"):  # --idle: quiet, not gone
        metrics.take(e, len(sessions))
    status = {
        (s[1]["pod"], s[1]["status"], s[1]["class"])
        for s in _samples(metrics)
        if s[0] == "diagnose_source_status"
    }
    assert status == {("vllm-oom", "failed", "kv_cache_too_small")}  # the healthy one closed and went
    _feed(metrics, sessions, "vllm-oom", VLLM / "kv-cache-too-small-v1.log")
    for e in sessions.close("vllm-oom", gone=True):  # its file removed: the pod is gone
        metrics.take(e, len(sessions))
    assert not [s for s in _samples(metrics) if s[0] == "diagnose_source_status"]


def test_durations_from_the_logs_own_timestamps_and_no_empty_labels() -> None:
    metrics, _ = _exercised()
    samples = _samples(metrics)
    startup = {s[0]: s[2] for s in samples if s[0].startswith("diagnose_startup_seconds")}
    assert startup["diagnose_startup_seconds_count"] == 1 and startup["diagnose_startup_seconds_sum"] > 0
    phases = {s[1]["phase"] for s in samples if s[0] == "diagnose_phase_seconds_count"}
    assert len(phases) >= 3
    assert ("diagnose_build_info", {"version": __import__("diagnose").__version__}, 1.0) in samples
    text = generate_latest(metrics.registry).decode()
    assert "_created" not in text and '=""' not in text
    findings = [s for s in samples if s[0] == "diagnose_findings_total"]
    assert findings and all(s[1]["oom_phase"] for s in findings)


def test_the_dashboard_asks_only_for_series_the_exporter_writes() -> None:
    dash = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 8 and all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"])
    metrics, _ = _exercised()
    written = {s[0] for s in _samples(metrics)}
    named = {n for e in exprs for n in re.findall(r"\b(diagnose_[a-z_]+)", e)}
    assert named and named <= written, named - written
    labels = {k for s in _samples(metrics) for k in s[1]}
    for e in exprs:  # the labels it groups or filters by exist too
        for group in re.findall(r"by \(([^)]*)\)", e):
            assert {x.strip() for x in group.split(",")} - {"le"} <= labels, e
        for key in re.findall(r"(\w+)=\"", e):
            assert key in labels, e
