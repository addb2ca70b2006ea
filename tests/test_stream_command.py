"""`diagnose stream`: records in the shapes the pipelines emit, many sources interleaved, a
verdict per source equal to `diagnose scan` on that source's log alone."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from diagnose.fleet.record_shapes import RecordReader
from diagnose.pipeline.scan import scan_paths

from .conftest import FIXTURES, REAL_LOGS, ROOT, run

LOGS = sorted((FIXTURES / "logs").glob("*/*.log"))
REAL = sorted(REAL_LOGS.glob("*/log.txt")) if REAL_LOGS.is_dir() else []
SHAPES = ("vector", "fluent-bit", "otlp", "loki", "cri")


def _record(shape: str, i: int, line: str, ts: int) -> list[str]:
    pod, ns, node = f"server-{i}", f"team-{i % 3}", f"gpu-node-{i % 7}"
    if shape == "vector":
        rec = {
            "message": line,
            "stream": "stderr",
            "timestamp": "2026-12-03T10:00:00Z",
            "kubernetes": {
                "pod_name": pod,
                "pod_namespace": ns,
                "container_name": "engine",
                "pod_node_name": node,
            },
        }
    elif shape == "fluent-bit":
        rec = {
            "date": 1764756000.0 + ts,
            "log": line + "\n",
            "stream": "stdout",
            "kubernetes": {"pod_name": pod, "namespace_name": ns, "container_name": "engine", "host": node},
        }
    elif shape == "otlp":  # the collector's file exporter: one ExportLogsServiceRequest a line
        attrs = [
            {"key": "k8s.pod.name", "value": {"stringValue": pod}},
            {"key": "k8s.namespace.name", "value": {"stringValue": ns}},
            {"key": "k8s.container.name", "value": {"stringValue": "engine"}},
            {"key": "k8s.node.name", "value": {"stringValue": node}},
        ]
        rec = {
            "resourceLogs": [
                {
                    "resource": {"attributes": attrs},
                    "scopeLogs": [
                        {
                            "logRecords": [
                                {"timeUnixNano": str(ts), "body": {"stringValue": line}, "severityNumber": 9}
                            ]
                        }
                    ],
                }
            ]
        }
    elif shape == "loki":  # logcli query --output jsonl
        rec = {
            "labels": {"namespace": ns, "pod": pod, "container": "engine", "node_name": node},
            "line": line,
            "timestamp": "2026-12-03T10:00:00Z",
        }
    else:  # CRI lines, kept raw by a pipeline keyed on the file: long lines split as partials
        out = []
        head, rest = line[:40], line[40:]
        if rest:
            out.append(
                json.dumps(
                    {"file": f"{ns}_{pod}/engine/0.log", "log": f"2026-12-03T10:00:00.1Z stdout P {head}"}
                )
            )
            line = rest
        out.append(
            json.dumps({"file": f"{ns}_{pod}/engine/0.log", "log": f"2026-12-03T10:00:00.2Z stdout F {line}"})
        )
        return out
    return [json.dumps(rec)]


def _source_of(shape: str, i: int) -> str:
    return f"team-{i % 3}_server-{i}/engine/0.log" if shape == "cri" else f"team-{i % 3}/server-{i}/engine"


def test_records_of_five_shapes_over_many_sources_get_scan_verdicts(know, cli, tmp_path: Path) -> None:
    assert len(LOGS) >= 50
    rng = random.Random(11)
    pending = {i: log.read_text(encoding="utf-8").splitlines() for i, log in enumerate(LOGS)}
    out_lines: list[str] = []
    ts = 0
    while pending:
        i = rng.choice(list(pending))
        ts += 1
        out_lines += _record(SHAPES[i % len(SHAPES)], i, pending[i].pop(0), ts)
        if not pending[i]:
            del pending[i]
    records = tmp_path / "records.jsonl"
    records.write_text("\n".join(out_lines) + "\n", encoding="utf-8")
    r = run([*cli, "stream", "--key", "file", "--events", "closed", "--summary", str(records)])
    assert r.returncode == 1, r.stderr  # some sources failed
    lines = [json.loads(x) for x in r.stdout.decode().splitlines()]
    closed = {x["source"]: x for x in lines if x["event"] == "closed"}
    assert len(closed) == len(LOGS)
    for i, log in enumerate(LOGS):
        want = scan_paths([str(log)], know)
        got = closed[_source_of(SHAPES[i % len(SHAPES)], i)]
        assert got["status"] == want.status, log
        assert (got["finding"] or {}).get("rule") == (want.primary.rule if want.primary else None), log
        assert (got["finding"] or {}).get("oom_phase") == (want.primary.oom_phase if want.primary else None)
        if not want.advice or "port" not in want.advice[0].param:  # a scan asks this host for a free port
            assert (got["change"] or {}).get("to") == (want.advice[0].to if want.advice else None), log
    summary = lines[-1]
    assert summary["event"] == "summary" and summary["sources"] == len(LOGS)
    assert sum(g["sources"] for g in summary["groups"]) == len(LOGS)


def test_a_loki_query_range_answer_is_read_oldest_first() -> None:
    answer = {
        "status": "success",
        "data": {
            "resultType": "streams",
            "result": [
                {
                    "stream": {"namespace": "llm", "pod": "vllm-0", "container": "vllm"},
                    "values": [["1700000000000000002", "second"], ["1700000000000000001", "first"]],
                }
            ],
        },
    }
    (rec,) = RecordReader().read(json.dumps(answer))
    assert rec.source == "llm/vllm-0/vllm" and rec.lines == ["first", "second"] and rec.shape == "loki"


def test_an_otlp_record_flattened_and_plain_text_and_an_engine_json_line() -> None:
    reader = RecordReader()
    flat = {
        "body": "INFO ready",
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "vllm-api"}}]},
    }
    (r1,) = reader.read(json.dumps(flat))
    assert (r1.source, r1.lines, r1.shape) == ("vllm-api", ["INFO ready"], "otlp")
    (r2,) = reader.read("INFO 06-05 06:17:26 plain text\n")
    assert (r2.source, r2.shape) == ("-", "text")
    engine_json = '{"timestamp": "2026-12-03T10:00:00", "level": "ERROR", "message": "CUDA out of memory"}'
    (r3,) = reader.read(engine_json)
    assert r3.source == "-" and r3.lines == [engine_json]  # the scan unwraps an engine's own JSON record


def test_cri_partial_lines_are_joined_per_source() -> None:
    reader = RecordReader()
    got = [
        rec.lines
        for raw in (
            "2026-12-03T10:00:00.1Z stderr P torch.OutOfMemoryError: CUDA out ",
            "2026-12-03T10:00:00.2Z stderr F of memory. Tried to allocate 2.00 GiB",
        )
        for rec in reader.read(raw)
    ]
    assert got == [[], ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]]


def test_usage_errors_are_one_line(cli) -> None:
    r = run([*cli, "stream", "--events", "nope"], stdin=b"")
    assert r.returncode == 2 and b"unknown event nope" in r.stderr and b"Traceback" not in r.stderr
    r = run([*cli, "stream", "/nonexistent/records.jsonl"])
    assert r.returncode == 2 and r.stderr.count(b"\n") == 1
    r = run([*cli, "stream", "--max-sessions", "0"], stdin=b"")
    assert r.returncode == 2


def test_empty_and_binary_input_end_quietly(cli) -> None:
    r = run([*cli, "stream"], stdin=b"")
    assert r.returncode == 0 and r.stdout == b""
    r = run([*cli, "stream", "--events", "closed"], stdin=b"\x00\xff\xfe garbage \x00\n")
    assert r.returncode in (0, 1) and b"Traceback" not in r.stderr


def test_input_lines_are_batched_per_read_and_an_over_long_line_keeps_its_head() -> None:
    import os
    import threading

    from diagnose.fleet import stream_command

    r, w = os.pipe()
    big = b"x" * (stream_command.MAX_INPUT_LINE + 200_000)

    def write() -> None:
        with os.fdopen(w, "wb") as f:
            f.write(b"first\nsec")
            f.flush()
            f.write(b"ond\n" + big + b"\nafter\nno newline at the end")

    t = threading.Thread(target=write)
    t.start()
    with os.fdopen(r, "rb") as f:
        lines = [x for batch in stream_command._batches(f) for x in batch]
    t.join()
    assert lines[:2] == [b"first", b"second"]
    assert lines[2] == b"x" * stream_command.MAX_INPUT_LINE
    assert lines[3:] == [b"after", b"no newline at the end"]


@pytest.mark.skipif(not REAL, reason="../shared/real-logs is absent")
def test_the_real_logs_in_five_shapes_over_133_sources_get_scan_verdicts(know, cli, tmp_path: Path) -> None:
    """The issue's acceptance: a recorded mix of the real logs, every record shape, interleaved."""
    rng = random.Random(5)
    pending = {
        i: log.read_bytes().decode("utf-8", "replace").replace("\r\n", "\n").split("\n")
        for i, log in enumerate(REAL)
    }
    out_lines: list[str] = []
    ts = 0
    while pending:
        i = rng.choice(list(pending))
        ts += 1
        take, pending[i] = pending[i][:20], pending[i][20:]  # a few lines of one source at a time
        for line in take:
            out_lines += _record(SHAPES[i % len(SHAPES)], i, line, ts)
        if not pending[i]:
            del pending[i]
    records = tmp_path / "records.jsonl"
    records.write_text("\n".join(out_lines) + "\n", encoding="utf-8")
    r = subprocess.run(
        [*cli, "stream", "--key", "file", "--events", "closed", str(records)],
        capture_output=True,
        timeout=600,
        cwd=ROOT,
    )
    closed = {x["source"]: x for x in map(json.loads, r.stdout.decode().splitlines())}
    assert len(closed) == len(REAL)
    differ = []
    for i, log in enumerate(REAL):
        want = scan_paths([str(log)], know)
        got = closed[_source_of(SHAPES[i % len(SHAPES)], i)]
        same = got["status"] == want.status and (got["finding"] or {}).get("rule") == (
            want.primary.rule if want.primary else None
        )
        if want.advice and "port" not in want.advice[0].param:
            same = same and (got["change"] or {}).get("to") == want.advice[0].to
        if not same:
            differ.append(log.parent.name)
    assert differ == []
