"""The node agent (`watch --glob`): the kubelet's log files of many containers followed at
once, in CRI format, through rotation, new pods and deleted ones."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from diagnose.fleet.node_agent import NodeAgent, identity
from diagnose.fleet.record_shapes import RecordReader
from diagnose.pipeline.scan import scan_paths
from diagnose.stream.session import Sessions

from .conftest import FIXTURES, ROOT

UID = "0f3c2a9e-5b1d-4c7e-9a2f-6d8e1b4c3a70"


def _cri(lines: list[str], split_at: int = 50) -> str:
    """The container runtime's format: long lines split into partial (P) pieces."""
    out = []
    for i, line in enumerate(lines):
        t = f"2026-12-03T10:00:{i % 60:02d}.{i:06d}Z stderr"
        while len(line) > split_at:
            out.append(f"{t} P {line[:split_at]}")
            line = line[split_at:]
        out.append(f"{t} F {line}")
    return "\n".join(out) + "\n"


def _pod_log(root: Path, ns: str, pod: str, container: str, restart: int = 0) -> Path:
    d = root / f"{ns}_{pod}_{UID}" / container
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{restart}.log"


def _drain(agent: NodeAgent, sessions: Sessions, reader: RecordReader) -> list:
    events = []
    for rec in agent.poll():
        for line in reader.joined(rec).lines:
            events += sessions.feed_line(rec.source, line, rec.labels)
    while agent.closed_sources:
        events += sessions.close(agent.closed_sources.pop(0))
    return events


def test_identity_of_the_kubelets_paths() -> None:
    assert identity(f"/var/log/pods/llm_vllm-0_{UID}/vllm/3.log", "node-7") == (
        "llm/vllm-0/vllm",
        {"namespace": "llm", "pod": "vllm-0", "container": "vllm", "node": "node-7"},
    )
    cid = "a" * 64
    assert identity(f"/var/log/containers/vllm-0_llm_engine-{cid}.log")[0] == "llm/vllm-0/engine"
    assert identity("/srv/logs/server.log") == ("/srv/logs/server.log", {})


def test_containers_followed_through_new_pods_rotation_and_deletion(know, tmp_path: Path) -> None:
    oom = (FIXTURES / "logs" / "vllm" / "kv-cache-too-small-v1.log").read_text(encoding="utf-8").splitlines()
    healthy = (FIXTURES / "logs" / "tgi" / "healthy-connected.log").read_text(encoding="utf-8").splitlines()
    agent = NodeAgent(str(tmp_path / "*" / "*" / "*.log"), node="gpu-1")
    sessions, reader = Sessions(know), RecordReader()

    a = _pod_log(tmp_path, "llm", "vllm-0", "vllm")
    a.write_text(_cri(oom[:10]), encoding="utf-8")
    events = _drain(agent, sessions, reader)
    assert "llm/vllm-0/vllm" in sessions and not [e for e in events if e.kind == "failed"]

    # the kubelet rotates: 0.log renamed with a time suffix, a new 0.log; the rest goes there
    a.rename(a.with_name("0.log.20261203-100000"))
    a.write_text(_cri(oom[10:]), encoding="utf-8")
    # a new pod appears meanwhile
    b = _pod_log(tmp_path, "llm", "tgi-0", "tgi")
    b.write_text(_cri(healthy), encoding="utf-8")
    events += _drain(agent, sessions, reader)
    events += _drain(agent, sessions, reader)
    for s in sessions.sessions():
        events += s.flush()

    # the pod is deleted: its files go, its session ends with the final verdict
    for f in a.parent.iterdir():
        f.unlink()
    events += _drain(agent, sessions, reader)
    closed = [e for e in events if e.kind == "closed"]
    assert [e.source for e in closed] == ["llm/vllm-0/vllm"]
    want = scan_paths([str(FIXTURES / "logs" / "vllm" / "kv-cache-too-small-v1.log")], know)
    assert closed[0].status == want.status == "failed"
    assert closed[0].finding["rule"] == want.primary.rule and closed[0].labels["node"] == "gpu-1"
    assert closed[0].diagnosis.lines_read == len(oom)  # every line once: none lost or repeated in rotation
    rest = {e.source: e for e in sessions.close_all() if e.kind == "closed"}
    assert rest["llm/tgi-0/tgi"].status == "ready"
    agent.close()


def test_a_truncated_file_is_read_again_from_its_start(know, tmp_path: Path) -> None:
    log = _pod_log(tmp_path, "llm", "vllm-1", "vllm")
    log.write_text(_cri(["INFO first run line"] * 5), encoding="utf-8")
    agent = NodeAgent(str(tmp_path / "*" / "*" / "*.log"))
    got = [line for rec in agent.poll() for line in RecordReader().joined(rec).lines]
    with open(log, "r+", encoding="utf-8") as f:  # copytruncate
        f.truncate(0)
    with open(log, "a", encoding="utf-8") as f:
        f.write(_cri(["INFO after truncation"]))
    got += [line for rec in agent.poll() for line in RecordReader().joined(rec).lines]
    assert got == ["INFO first run line"] * 5 + ["INFO after truncation"]
    agent.close()


def test_from_end_skips_what_the_files_held_at_start_only(tmp_path: Path) -> None:
    log = _pod_log(tmp_path, "llm", "vllm-2", "vllm")
    log.write_text(_cri(["INFO old"]), encoding="utf-8")
    agent = NodeAgent(str(tmp_path / "*" / "*" / "*.log"), from_end=True)
    assert list(agent.poll()) == []
    with open(log, "a", encoding="utf-8") as f:
        f.write(_cri(["INFO new"]))
    newer = _pod_log(tmp_path, "llm", "vllm-3", "vllm")
    newer.write_text(_cri(["INFO a new pod's first line"]), encoding="utf-8")
    lines = {rec.source: [x for x in RecordReader().joined(rec).lines] for rec in agent.poll()}
    assert lines == {"llm/vllm-2/vllm": ["INFO new"], "llm/vllm-3/vllm": ["INFO a new pod's first line"]}
    agent.close()


def test_watch_glob_prints_verdict_lines(cli, tmp_path: Path) -> None:
    oom = (FIXTURES / "logs" / "vllm" / "kv-cache-too-small-v1.log").read_text(encoding="utf-8").splitlines()
    _pod_log(tmp_path, "llm", "vllm-0", "vllm").write_text(_cri(oom), encoding="utf-8")
    r = subprocess.run(
        [
            *cli,
            "watch",
            "--glob",
            str(tmp_path / "*" / "*" / "*.log"),
            "--timeout",
            "2",
            "--events",
            "closed",
        ],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "NODE_NAME": "gpu-9"},
    )
    assert r.returncode == 1, r.stderr
    (line,) = [json.loads(x) for x in r.stdout.decode().splitlines()]
    assert line["event"] == "closed" and line["status"] == "failed" and line["labels"]["node"] == "gpu-9"
    assert line["finding"]["class"] == "kv_cache_too_small"
    r = subprocess.run([*cli, "watch", "x.log", "--glob", "*.log"], capture_output=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and b"not both" in r.stderr


def test_the_daemonset_example_runs_as_written(cli, tmp_path: Path) -> None:
    """docs/daemonset.yaml's command, with a local glob, a free metrics port and a short life."""
    import yaml

    doc = yaml.safe_load((ROOT / "docs" / "daemonset.yaml").read_text(encoding="utf-8"))
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:2] == ["diagnose", "watch"]
    local = {
        "--glob": str(tmp_path / "*" / "*" / "*.log"),
        "--metrics-port": "0",
        "--metrics-addr": "127.0.0.1",
        "--alertmanager": "http://127.0.0.1:9",  # nothing there: a warning at the end, no failure
    }
    argv = [
        a if a.split("=")[0] not in local else f"{a.split('=')[0]}={local[a.split('=')[0]]}" for a in args[2:]
    ]
    r = subprocess.run([*cli, "watch", *argv, "--timeout", "1"], capture_output=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr


def test_an_unreadable_file_is_said_once_and_the_others_still_followed(tmp_path: Path, monkeypatch) -> None:
    """No permission, or too many open files: one problem a path, the other files followed, and the
    file tried again on later polls (it is read once it can be)."""
    from diagnose.fleet import node_agent

    ok = _pod_log(tmp_path, "llm", "vllm-0", "vllm")
    ok.write_text(_cri(["INFO first"]), encoding="utf-8")
    shut = _pod_log(tmp_path, "llm", "vllm-1", "vllm")
    shut.write_text(_cri(["INFO hidden"]), encoding="utf-8")
    real_open = open

    def refusing_open(path, *a, **kw):  # type: ignore[no-untyped-def]
        if str(path) == str(shut):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **kw)

    monkeypatch.setattr(node_agent, "open", refusing_open, raising=False)
    agent = NodeAgent(str(tmp_path / "*" / "*" / "*.log"))
    first = {rec.source for rec in agent.poll()}
    second = {rec.source for rec in agent.poll()}
    assert first == {"llm/vllm-0/vllm"} and second == set()
    assert agent.problems == [f"{shut}: cannot read: Permission denied"]
    monkeypatch.setattr(node_agent, "open", real_open, raising=False)
    assert [line for rec in agent.poll() for line in RecordReader().joined(rec).lines] == ["INFO hidden"]
    agent.close()
