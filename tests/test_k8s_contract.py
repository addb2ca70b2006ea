"""`diagnose k8s`, contract tests: no real API server can run on these machines, so a loopback
HTTP server answers with the Kubernetes API's real JSON shapes (core/v1 PodList with
containerStatuses and lastState.terminated, pod logs with `previous=true`, EventList with
involvedObject, Event creation), reached by the official client through a kubeconfig, as a
user's would be. Five pods: a crash-looping OOM (its previous log), a liveness-probe kill
while loading, an OOMKilled host-memory case, a pod pending for GPUs, a healthy one."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

import pytest

from .conftest import FIXTURES, run

pytest.importorskip(
    "kubernetes", reason="the kubernetes client is the k8s extra (pip install 'diagnose-llm[k8s]')"
)

LOGS = FIXTURES / "logs"
NS = "llm"
T0 = "2026-12-03T10:00:00Z"


def _lines(path: Path, n: int | None = None) -> str:
    lines = path.read_text(encoding="utf-8").splitlines()
    return "\n".join(lines[:n] if n else lines) + "\n"


def _container(name: str = "vllm", memory: str = "32Gi", probe: dict | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name,
        "image": "vllm/vllm-openai:v0.6.1.post2",
        "args": ["--model", "Qwen/Qwen2.5-7B-Instruct"],
        "ports": [{"containerPort": 8000, "protocol": "TCP"}],
        "resources": {
            "limits": {"memory": memory, "nvidia.com/gpu": "1"},
            "requests": {"nvidia.com/gpu": "1"},
        },
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    if probe:
        c["livenessProbe"] = probe
    return c


def _pod(name: str, containers: list[dict], status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": {"app": "vllm"},
            "creationTimestamp": T0,
        },
        "spec": {
            "containers": containers,
            "nodeName": None if status["phase"] == "Pending" else "gpu-node-1",
        },
        "status": status,
    }


def _status(name: str, restarts: int, state: dict, last: dict | None = None, ready: bool = False) -> dict:
    st: dict[str, Any] = {
        "name": name,
        "ready": ready,
        "restartCount": restarts,
        "state": state,
        "image": "vllm/vllm-openai:v0.6.1.post2",
        "imageID": "docker-pullable://vllm/vllm-openai@sha256:0",
        "containerID": "containerd://0",
        "started": ready,
    }
    st["lastState"] = {"terminated": last} if last else {}
    return st


def _terminated(code: int, reason: str, started: str, finished: str) -> dict:
    return {
        "exitCode": code,
        "reason": reason,
        "startedAt": started,
        "finishedAt": finished,
        "containerID": "containerd://1",
    }


def _event(pod: str, reason: str, message: str, kind: str = "Warning", count: int = 1) -> dict:
    return {
        "metadata": {"name": f"{pod}.{reason.lower()}", "namespace": NS},
        "involvedObject": {
            "kind": "Pod",
            "namespace": NS,
            "name": pod,
            "uid": f"uid-{pod}",
            "apiVersion": "v1",
        },
        "reason": reason,
        "message": message,
        "source": {"component": "kubelet", "host": "gpu-node-1"},
        "firstTimestamp": T0,
        "lastTimestamp": T0,
        "count": count,
        "type": kind,
    }


PROBE = {
    "httpGet": {"path": "/health", "port": 8000, "scheme": "HTTP"},
    "initialDelaySeconds": 60,
    "periodSeconds": 10,
    "timeoutSeconds": 1,
    "successThreshold": 1,
    "failureThreshold": 3,
}
CRASHLOOP = {
    "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s restarting failed container"}
}

PODS = [
    _pod(
        "vllm-oom-0",
        [_container()],
        {
            "phase": "Running",
            "containerStatuses": [
                _status(
                    "vllm",
                    4,
                    CRASHLOOP,
                    _terminated(1, "Error", "2026-12-03T10:00:00Z", "2026-12-03T10:01:12Z"),
                )
            ],
        },
    ),
    _pod(
        "vllm-probe-0",
        [_container(probe=PROBE)],
        {
            "phase": "Running",
            "containerStatuses": [
                _status(
                    "vllm",
                    2,
                    {"running": {"startedAt": "2026-12-03T10:10:00Z"}},
                    _terminated(137, "Error", "2026-12-03T10:00:00Z", "2026-12-03T10:01:30Z"),
                )
            ],
        },
    ),
    _pod(
        "vllm-hostmem-0",
        [_container(memory="32Gi")],
        {
            "phase": "Running",
            "containerStatuses": [
                _status(
                    "vllm",
                    1,
                    CRASHLOOP,
                    _terminated(137, "OOMKilled", "2026-12-03T10:00:00Z", "2026-12-03T10:00:40Z"),
                )
            ],
        },
    ),
    _pod(
        "vllm-pending-0",
        [_container()],
        {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                }
            ],
        },
    ),
    _pod(
        "vllm-healthy-0",
        [_container()],
        {
            "phase": "Running",
            "containerStatuses": [_status("vllm", 0, {"running": {"startedAt": T0}}, None, ready=True)],
        },
    ),
]

LOGS_OF = {
    ("vllm-oom-0", True): _lines(LOGS / "vllm" / "oom-load-v1-tp2.log"),
    ("vllm-oom-0", False): _lines(LOGS / "vllm" / "oom-load-v1-tp2.log", 5),
    # killed at 1/4 shards: the kubelet's SIGKILL leaves the log where loading stood
    ("vllm-probe-0", True): _lines(LOGS / "vllm" / "healthy-v0-061-ready.log", 10),
    ("vllm-probe-0", False): _lines(LOGS / "vllm" / "healthy-v0-061-ready.log", 3),
    ("vllm-hostmem-0", True): _lines(LOGS / "vllm" / "healthy-v0-061-ready.log", 11),
    ("vllm-hostmem-0", False): "",
    ("vllm-healthy-0", False): _lines(LOGS / "vllm" / "healthy-v0-061-ready.log"),
}

EVENTS = {
    "vllm-oom-0": [
        _event(
            "vllm-oom-0",
            "BackOff",
            "Back-off restarting failed container vllm in pod vllm-oom-0_llm(uid)",
            count=12,
        )
    ],
    "vllm-probe-0": [
        _event(
            "vllm-probe-0",
            "Unhealthy",
            'Liveness probe failed: Get "http://10.42.0.17:8000/health": dial tcp 10.42.0.17:8000: connect: connection refused',
            count=3,
        ),
        _event(
            "vllm-probe-0",
            "Killing",
            "Container vllm failed liveness probe, will be restarted",
            kind="Normal",
        ),
    ],
    "vllm-hostmem-0": [
        _event(
            "vllm-hostmem-0",
            "BackOff",
            "Back-off restarting failed container vllm in pod vllm-hostmem-0_llm(uid)",
        )
    ],
    "vllm-pending-0": [
        _event(
            "vllm-pending-0",
            "FailedScheduling",
            "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available: "
            "4 No preemption victims found for incoming pod.",
        )
    ],
    "vllm-healthy-0": [],
}


class FakeApi(BaseHTTPRequestHandler):
    created: ClassVar[list[dict]] = []
    seen: ClassVar[list[str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
        raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        u = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(u.query).items()}
        FakeApi.seen.append(self.path)
        parts = u.path.strip("/").split("/")
        if u.path == f"/api/v1/namespaces/{NS}/pods":
            sel = q.get("labelSelector", "")
            items = [p for p in PODS if not sel or sel == "app=vllm"]
            self._send(
                200,
                {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items},
            )
        elif len(parts) == 7 and parts[4] == "pods" and parts[6] == "log":
            key = (parts[5], q.get("previous") == "true")
            if key not in LOGS_OF:
                msg = f'previous terminated container "vllm" in pod "{parts[5]}" not found'
                self._send(
                    400,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "message": msg,
                        "reason": "BadRequest",
                        "code": 400,
                    },
                )
            else:
                self._send(200, LOGS_OF[key], "text/plain")
        elif u.path == f"/api/v1/namespaces/{NS}/events":
            name = q.get("fieldSelector", "").removeprefix("involvedObject.name=")
            self._send(
                200, {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": EVENTS.get(name, [])}
            )
        else:
            self._send(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeApi.created.append(body)
        self._send(201, {**body, "metadata": {**body["metadata"], "name": "created"}})


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeApi.created, FakeApi.seen = [], []
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
        f"clusters:\n- name: test\n  cluster:\n    server: http://127.0.0.1:{server.server_port}\n"
        "contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: llm\n"
        "users:\n- name: test\n  user:\n    token: not-a-real-token\n"
    )
    yield cfg
    server.shutdown()


def _verdicts(cli, cfg: Path, *extra: str) -> tuple[int, dict[str, dict]]:
    r = run([*cli, "k8s", "-n", NS, "-l", "app=vllm", "--kubeconfig", str(cfg), "--json", *extra])
    assert b"Traceback" not in r.stderr, r.stderr
    return r.returncode, {v["pod"]: v for v in json.loads(r.stdout)}


def test_contract_a_crash_looping_oom_pod_is_read_from_its_previous_log(cli, kubeconfig: Path) -> None:
    rc, by_pod = _verdicts(cli, kubeconfig)
    v = by_pod["vllm-oom-0"]
    assert rc == 1 and v["log"] == "previous" and v["restarts"] == 4
    assert (
        v["status"] == "failed" and v["class"] == "oom" and v["diagnosis"]["primary"]["oom_phase"] == "load"
    )
    assert v["change"] is not None and v["last_terminated"]["exit_code"] == 1
    assert any("previous=true" in p for p in FakeApi.seen)


def test_contract_a_liveness_probe_kill_while_loading_gets_the_probe_budget(cli, kubeconfig: Path) -> None:
    _, by_pod = _verdicts(cli, kubeconfig)
    v = by_pod["vllm-probe-0"]
    assert v["status"] == "failed" and v["class"] == "probe_killed" and v["phase"] == "load_weights"
    ch = v["change"]
    assert ch["param"] == "startupProbe.failureThreshold" and ch["from"].startswith("90 s")
    # ran 90 s and had loaded 1 of 4 shards: about 360 s to start, 1.5× that, in 10 s periods
    assert ch["to"] == "failureThreshold: 54 with periodSeconds: 10 (540 s)"
    assert "1/4 weight shards" in ch["why"] and "failed liveness probe" in v["evidence"]


def test_contract_oomkilled_without_cuda_oom_is_host_memory(cli, kubeconfig: Path) -> None:
    _, by_pod = _verdicts(cli, kubeconfig)
    v = by_pod["vllm-hostmem-0"]
    assert v["status"] == "failed" and v["class"] == "host_oom_killed"
    assert v["change"]["param"] == "resources.limits.memory" and v["change"]["from"] == "32Gi"
    assert v["change"]["to"] == "48Gi" and v["last_terminated"]["reason"] == "OOMKilled"


def test_contract_a_pod_pending_for_gpus_says_so(cli, kubeconfig: Path) -> None:
    _, by_pod = _verdicts(cli, kubeconfig)
    v = by_pod["vllm-pending-0"]
    assert (
        v["status"] == "pending"
        and v["class"] == "unschedulable"
        and "Insufficient nvidia.com/gpu" in v["evidence"]
    )
    assert v["change"]["param"] == "resources.limits.nvidia.com/gpu" and v["change"]["from"] == "1"


def test_contract_a_healthy_pod_is_ready(cli, kubeconfig: Path) -> None:
    _, by_pod = _verdicts(cli, kubeconfig)
    v = by_pod["vllm-healthy-0"]
    assert v["status"] == "ready" and v["class"] is None and v["log"] == "current"


def test_contract_emit_events_posts_core_v1_events(cli, kubeconfig: Path) -> None:
    rc, _ = _verdicts(cli, kubeconfig, "--emit-events")
    assert rc == 1
    by_pod = {e["involvedObject"]["name"]: e for e in FakeApi.created}
    e = by_pod["vllm-probe-0"]
    assert (
        e["reason"] == "DiagnoseFailed" and e["type"] == "Warning" and e["source"]["component"] == "diagnose"
    )
    assert e["message"].startswith("diagnose: failed probe_killed")
    assert by_pod["vllm-healthy-0"]["type"] == "Normal"


def test_contract_the_table_and_an_unreachable_api_server(cli, kubeconfig: Path, tmp_path: Path) -> None:
    r = run([*cli, "k8s", "-n", NS, "--kubeconfig", str(kubeconfig)])
    out = r.stdout.decode()
    assert r.returncode == 1 and "vllm-probe-0" in out and "probe_killed" in out and "48Gi" in out
    dead = tmp_path / "dead"
    dead.write_text(kubeconfig.read_text().replace("server: http://127.0.0.1:", "server: http://127.0.0.1:1"))
    r = run([*cli, "k8s", "-n", NS, "--kubeconfig", str(dead)])
    assert r.returncode == 2 and r.stderr.count(b"\n") == 1 and b"Kubernetes API" in r.stderr
    r = run([*cli, "k8s", "--kubeconfig", str(tmp_path / "missing")])
    assert r.returncode == 2 and b"Kubernetes configuration" in r.stderr
