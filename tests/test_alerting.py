"""Alerts into the stack people already run, against the real servers: Prometheus scrapes
`diagnose stream --metrics-port` and the series are read back through its HTTP API;
`--alertmanager` posts an alert and it is read back from Alertmanager's v2 API. Both bound to
127.0.0.1. `.ci/run` installs them (Debian's `prometheus`, `prometheus-alertmanager`); outside
CI the tests skip with one line when the binaries are absent."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import FIXTURES, ROOT

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
OOM_LOG = FIXTURES / "logs" / "vllm" / "kv-cache-too-small-v1.log"


def _need(binary: str | None, name: str) -> str:
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed: .ci/run installs it")
        pytest.skip(f"{name} not installed (Debian package {name}); CI installs it")
    return binary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered")


def _records(pod: str, log: Path = OOM_LOG) -> bytes:
    labels = {
        "pod_name": pod,
        "pod_namespace": "llm",
        "container_name": "vllm",
        "pod_node_name": "gpu-node-3",
    }
    lines = log.read_text(encoding="utf-8").splitlines()
    return "".join(json.dumps({"message": x, "kubernetes": labels}) + "\n" for x in lines).encode()


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    yield from _alertmanager(tmp_path, "")


@pytest.fixture
def alertmanager_15s(tmp_path: Path) -> Iterator[str]:
    """Alertmanager resolving an alert 15 s after its last post when it names no endsAt."""
    yield from _alertmanager(tmp_path, "global:\n  resolve_timeout: 15s\n")


def _alertmanager(tmp_path: Path, head: str) -> Iterator[str]:
    exe = _need(ALERTMANAGER, "prometheus-alertmanager")
    port = _free_port()
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(head + 'route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n')
    p = subprocess.Popen(
        [
            exe,
            f"--config.file={cfg}",
            f"--storage.path={tmp_path / 'am'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(url + "/api/v2/status")
        yield url
    finally:
        p.terminate()
        p.wait(10)


def test_a_failure_posted_to_alertmanager_is_read_back(cli, alertmanager: str) -> None:
    r = subprocess.run(
        [*cli, "stream", "--events", "failed", "--alertmanager", alertmanager],
        input=_records("vllm-0"),
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 1, r.stderr
    alerts = httpx.get(alertmanager + "/api/v2/alerts", timeout=5).json()
    (a,) = [a for a in alerts if a["labels"].get("pod") == "vllm-0"]
    assert a["labels"]["alertname"] == "InferenceServerFailed"
    assert a["labels"]["class"] == "kv_cache_too_small" and a["labels"]["oom_phase"] == "startup"
    assert a["labels"]["namespace"] == "llm" and a["labels"]["node"] == "gpu-node-3"
    assert a["annotations"]["change"] == "--max-model-len 72704 (was 131072)"
    assert a["annotations"]["evidence"].startswith("line 32: ValueError: To serve at least one request")
    assert a["status"]["state"] == "active"


def _state(alertmanager: str, pod: str) -> str | None:
    """The alert of this pod as Alertmanager has it now: active, or None (resolved or never)."""
    alerts = httpx.get(alertmanager + "/api/v2/alerts", params={"active": "true"}, timeout=5).json()
    mine = [a for a in alerts if a["labels"].get("pod") == pod and a["status"]["state"] == "active"]
    return "active" if mine else None


def test_a_firing_alert_stays_active_while_the_server_is_down_and_resolves_when_ready(
    cli, alertmanager_15s: str
) -> None:
    """resolve_timeout 15 s: the failed pod's alert is still active after 60 s of silence (a
    crashed pod says nothing more), and resolved within 15 s of the restarted pod's ready."""
    stream = subprocess.Popen(
        [
            *cli,
            "stream",
            "--events",
            "failed,ready",
            "--alertmanager",
            alertmanager_15s,
            "--alert-repost",
            "5",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert stream.stdin is not None
        stream.stdin.write(_records("vllm-7"))
        stream.stdin.flush()
        deadline = time.monotonic() + 30
        while _state(alertmanager_15s, "vllm-7") is None and time.monotonic() < deadline:
            time.sleep(0.5)
        fired = time.monotonic()
        assert _state(alertmanager_15s, "vllm-7") == "active", "never fired"
        labels = next(
            a["labels"]
            for a in httpx.get(alertmanager_15s + "/api/v2/alerts", timeout=5).json()
            if a["labels"].get("pod") == "vllm-7"
        )
        assert labels["severity"] == "critical" and labels["class"] == "kv_cache_too_small"
        while time.monotonic() - fired < 60:
            time.sleep(5)
            assert _state(alertmanager_15s, "vllm-7") == "active", (
                f"resolved after {time.monotonic() - fired:.0f} s"
            )
        # the pod restarts and its new run reaches ready
        stream.stdin.write(_records("vllm-7", FIXTURES / "logs" / "vllm" / "healthy-v1-serving.log"))
        stream.stdin.flush()
        ready = time.monotonic()
        while _state(alertmanager_15s, "vllm-7") == "active" and time.monotonic() - ready < 20:
            time.sleep(0.5)
        assert _state(alertmanager_15s, "vllm-7") is None
        assert time.monotonic() - ready <= 15
    finally:
        if stream.stdin is not None:
            stream.stdin.close()
        stream.wait(30)


def test_an_unreachable_alertmanager_is_one_warning_not_a_crash(cli) -> None:
    port = _free_port()  # nothing listens there
    r = subprocess.run(
        [*cli, "stream", "--events", "failed", "--alertmanager", f"http://127.0.0.1:{port}"],
        input=_records("vllm-1"),
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 1 and b"alert not posted" in r.stderr and b"Traceback" not in r.stderr


def test_prometheus_scrapes_the_stream_and_the_series_read_back(cli, tmp_path: Path) -> None:
    exe = _need(PROMETHEUS, "prometheus")
    metrics_port, prom_port = _free_port(), _free_port()
    stream = subprocess.Popen(
        [*cli, "stream", "--events", "failed,closed", "--idle", "3", "--metrics-port", str(metrics_port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: diagnose\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n"
    )
    prom = subprocess.Popen(
        [
            exe,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    api = f"http://127.0.0.1:{prom_port}/api/v1/query"
    try:
        assert stream.stdin is not None
        stream.stdin.write(_records("vllm-0"))
        stream.stdin.flush()  # the stream stays open: the server is still "running"
        _wait_http(f"http://127.0.0.1:{prom_port}/-/ready")
        deadline, found = time.monotonic() + 45, []
        while time.monotonic() < deadline and not found:
            time.sleep(0.5)
            res = httpx.get(
                api, params={"query": 'diagnose_source_status{status="failed"}'}, timeout=5
            ).json()
            found = res["data"]["result"]
        assert found, "Prometheus never had the failed source's series"
        series = found[0]["metric"]
        assert series["pod"] == "vllm-0" and series["namespace"] == "llm" and series["node"] == "gpu-node-3"
        assert found[0]["value"][1] == "1"
        res = httpx.get(
            api, params={"query": 'diagnose_findings_total{class="kv_cache_too_small"}'}, timeout=5
        ).json()
        assert res["data"]["result"] and res["data"]["result"][0]["metric"]["oom_phase"] == "startup"
        assert series["class"] == "kv_cache_too_small"
        # --idle closes the quiet source: a crashed pod goes quiet, its series must stay
        time.sleep(8)
        closed = json.loads(stream.stdout.readline()) if stream.stdout else {}
        assert closed.get("event") in ("failed", "closed")
        res = httpx.get(api, params={"query": 'diagnose_source_status{status="failed"}'}, timeout=5).json()
        assert res["data"]["result"], "the failed source's series went with --idle"

        def query(q: str) -> list:  # type: ignore[type-arg]
            return httpx.get(api, params={"query": q}, timeout=5).json()["data"]["result"]

        assert query("diagnose_build_info")[0]["metric"]["version"]
        assert query('{__name__=~"diagnose_.*_created"}') == []  # no `_created` series
        exposed = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        assert '=""' not in exposed  # no empty label (PromQL cannot tell one from a missing label)
    finally:
        prom.terminate()
        if stream.stdin is not None:
            stream.stdin.close()
        stream.wait(30)
        prom.wait(10)
    assert stream.returncode == 1


def test_fleet_option_errors_are_one_line(cli) -> None:
    for args, said in (
        (["--alertmanager", "alertmanager:9093"], b"not an http(s) URL"),
        (["--metrics-port", "70000"], b"not a port"),
        (["--idle", "0"], b"--idle"),
    ):
        r = subprocess.run([*cli, "stream", *args], input=b"", capture_output=True, timeout=60, cwd=ROOT)
        assert r.returncode == 2 and said in r.stderr and r.stderr.count(b"\n") == 1, (args, r.stderr)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run(
            [*cli, "stream", "--metrics-port", str(port)],
            input=b"",
            capture_output=True,
            timeout=60,
            cwd=ROOT,
        )
    assert r.returncode == 2 and b"cannot listen" in r.stderr and b"Traceback" not in r.stderr
