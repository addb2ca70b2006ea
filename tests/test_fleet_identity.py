"""A source's identity from whatever carries it, so that two servers are never one verdict: one
source per input file, the `kubectl logs --prefix` bracket (with `--timestamps` too), journald's
host and unit, Docker's container from its json-file's path, `docker compose logs`' service,
several `--key` fields (the host first when the keys do not name it). Each shape is a recording
of four real logs of different engines and failures, interleaved; each source's verdict must
be `diagnose scan`'s of that log alone."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from diagnose.fleet.record_shapes import RecordReader
from diagnose.pipeline.scan import scan_paths
from diagnose.read.clock import utc_time

from .conftest import REAL_LOGS, run

NAMES = [
    "vllm-042-oom-startup-max-seq-len-29k-rtx3090-stripped",
    "ollama-002-port-11434-already-in-use",
    "sglang-007-nccl-unhandled-system-error-glm45",
    "vllm-409-healthy-v0171-llama31-8b-sagemaker-warn",
]
LOGS = [REAL_LOGS / n / "log.txt" for n in NAMES]

pytestmark = pytest.mark.skipif(not all(p.is_file() for p in LOGS), reason="../shared/real-logs is absent")


def _lines(p: Path) -> list[str]:
    return p.read_bytes().decode("utf-8", "replace").replace("\r\n", "\n").rstrip("\n").split("\n")


def _interleaved(shape: Any) -> list[str]:
    """The four logs' lines, a few of one source at a time in a random order, each made a line
    of the input by `shape(i, line, n)`."""
    rng = random.Random(7)
    pending = {i: _lines(p) for i, p in enumerate(LOGS)}
    out: list[str] = []
    n = 0
    while pending:
        i = rng.choice(list(pending))
        take, pending[i] = pending[i][:7], pending[i][7:]
        for line in take:
            n += 1
            out.append(shape(i, line, n))
        if not pending[i]:
            del pending[i]
    return out


def _verdicts(cli: list[str], args: list[str], stdin: bytes | None = None) -> dict[str, dict[str, Any]]:
    r = run([*cli, "stream", "--events", "closed", *args], stdin=stdin)
    assert r.returncode in (0, 1), r.stderr
    return {x["source"]: x for x in map(json.loads, r.stdout.decode().splitlines())}


def _same_as_scan(closed: dict[str, dict[str, Any]], source_of: Any, know: Any) -> None:
    assert len(closed) == len(LOGS), sorted(closed)
    for i, log in enumerate(LOGS):
        want = scan_paths([str(log)], know)
        got = closed[source_of(i)]
        assert got["status"] == want.status, (log.parent.name, got["status"], want.status)
        assert (got["finding"] or {}).get("rule") == (want.primary.rule if want.primary else None), log
        if want.advice and "port" not in want.advice[0].param:
            assert (got["change"] or {}).get("to") == want.advice[0].to, log


def test_one_source_per_input_file(know, cli, tmp_path: Path) -> None:
    files = []
    for i, p in enumerate(LOGS):
        f = tmp_path / f"server-{i}.log"
        f.write_text("\n".join(_lines(p)) + "\n", encoding="utf-8")
        files.append(str(f))
    closed = _verdicts(cli, files)
    _same_as_scan(closed, lambda i: files[i], know)
    assert len({x["status"] for x in closed.values()}) > 1  # never one merged verdict


@pytest.mark.parametrize("timestamps", [False, True])
def test_kubectl_logs_prefix(know, cli, timestamps: bool) -> None:
    def shape(i: int, line: str, n: int) -> str:
        stamp = f"2026-12-04T10:{n // 60 % 60:02d}:{n % 60:02d}.{n:09d}Z " if timestamps else ""
        return f"[pod/server-{i}-7d9f/engine] {stamp}{line}"

    data = "\n".join(_interleaved(shape)).encode() + b"\n"
    closed = _verdicts(cli, [], stdin=data)
    _same_as_scan(closed, lambda i: f"server-{i}-7d9f/engine", know)
    any_ = next(iter(closed.values()))
    assert any_["labels"]["pod"].startswith("server-") and any_["labels"]["container"] == "engine"
    if timestamps:
        assert all(x["time"] is None or x["time"].startswith("2026-12-04T10:") for x in closed.values())


def test_journald_host_and_unit(know, cli) -> None:
    """The same unit on four hosts: four sources, the host a `node` label, `_PID` a label."""

    def shape(i: int, line: str, n: int) -> str:
        return json.dumps(
            {
                "__CURSOR": f"s=1;i={n}",
                "__REALTIME_TIMESTAMP": str(1764842400000000 + n * 1000),
                "_HOSTNAME": f"gpu-{i}",
                "_SYSTEMD_UNIT": "llm.service",
                "_PID": str(4000 + i),
                "MESSAGE": line,
            }
        )

    closed = _verdicts(cli, [], stdin="\n".join(_interleaved(shape)).encode() + b"\n")
    _same_as_scan(closed, lambda i: f"gpu-{i}/llm.service", know)
    x = closed["gpu-1/llm.service"]
    assert x["labels"]["node"] == "gpu-1" and x["labels"]["pid"] == "4001"
    assert x["time"].startswith("2025-12-04T")  # the journal's own clock, in UTC


def test_journald_with_a_unit_key_still_tells_the_hosts_apart(know, cli) -> None:
    def shape(i: int, line: str, n: int) -> str:
        return json.dumps({"host": f"gpu-{i}", "unit": "llm.service", "msg": line})

    data = "\n".join(_interleaved(shape)).encode() + b"\n"
    closed = _verdicts(cli, ["--key", "unit"], stdin=data)
    _same_as_scan(closed, lambda i: f"gpu-{i}/llm.service", know)
    assert closed["gpu-2/llm.service"]["labels"]["node"] == "gpu-2"


def test_several_key_fields(know, cli) -> None:
    def shape(i: int, line: str, n: int) -> str:
        return json.dumps({"cluster": "east", "app": {"name": "llm", "replica": i}, "message": line})

    data = "\n".join(_interleaved(shape)).encode() + b"\n"
    closed = _verdicts(cli, ["--key", "cluster", "--key", "app.name,app.replica"], stdin=data)
    _same_as_scan(closed, lambda i: f"east/llm/{i}", know)


def test_docker_json_file_lines_by_their_container(know, cli, tmp_path: Path) -> None:
    ids = [f"{i:x}" * 64 for i in range(10, 14)]
    paths = []
    for i, p in enumerate(LOGS):
        folder = tmp_path / "containers" / ids[i][:64]
        folder.mkdir(parents=True)
        f = folder / f"{ids[i][:64]}-json.log"
        f.write_text(
            "".join(
                json.dumps(
                    {"log": line + "\n", "stream": "stderr", "time": f"2026-12-04T10:00:{n % 60:02d}.5Z"}
                )
                + "\n"
                for n, line in enumerate(_lines(p))
            )
        )
        paths.append(str(f))
    closed = _verdicts(cli, paths)
    _same_as_scan(closed, lambda i: ids[i][:12], know)
    assert closed[ids[0][:12]]["labels"] == {"container_id": ids[0][:12]}


def test_docker_compose_services(know, cli) -> None:
    def shape(i: int, line: str, n: int) -> str:
        return f"llm-{i + 1}  | {line}"

    closed = _verdicts(cli, [], stdin="\n".join(_interleaved(shape)).encode() + b"\n")
    _same_as_scan(closed, lambda i: f"llm-{i + 1}", know)


def test_a_line_is_not_mistaken_for_an_identity() -> None:
    reader = RecordReader()
    for line in (
        "INFO | a logger's bar",
        "Processed prompts: 100%|██████████| 8/8",
        "| 0  NVIDIA H100 80GB HBM3  On |",
        "[2026-12-04 10:00:00 TP0] Load weight begin",
        "[rank0]: Traceback (most recent call last):",
    ):
        (rec,) = reader.read(line, "serve.log")
        assert rec.source == "serve.log" and rec.lines == [line], line


def test_record_times_in_utc() -> None:
    assert utc_time("2026-12-04T11:00:00.123456789+01:00") == "2026-12-04T10:00:00.123Z"
    assert utc_time("1764842400000000") == "2025-12-04T10:00:00.000Z"  # journald: microseconds
    assert utc_time("1764842400000000000") == "2025-12-04T10:00:00.000Z"  # OTLP, Loki: nanoseconds
    assert utc_time(1764842400) == "2025-12-04T10:00:00.000Z"
    assert utc_time("03-10 07:38:43") is None  # a log's own text: no year, no zone
    assert utc_time("") is None and utc_time(None) is None


DJANGO = """[04/Dec/2026 10:00:01] "GET /api/items HTTP/1.1" 200 512
Internal Server Error: /api/orders
Traceback (most recent call last):
  File "/usr/local/lib/python3.11/site-packages/django/core/handlers/exception.py", line 55, in inner
    response = get_response(request)
  File "/app/orders/views.py", line 42, in create
    total = sum(item.price for item in order.items)
TypeError: unsupported operand type(s) for +: 'int' and 'NoneType'
[04/Dec/2026 10:00:02] "POST /api/orders HTTP/1.1" 500 145
"""


def test_a_web_apps_traceback_is_not_an_inference_server_failing(cli, tmp_path: Path) -> None:
    """A Django container beside the servers: its request traceback fails no inference server;
    a server's own OOM still fails without its banner (an excerpt), and an engine's log fails."""
    web = tmp_path / "web.log"
    web.write_text(DJANGO)
    oom = tmp_path / "excerpt.log"
    oom.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    r = run([*cli, "stream", "--events", "closed", str(web), str(oom)])
    closed = {x["source"]: x for x in map(json.loads, r.stdout.decode().splitlines())}
    assert closed[str(web)]["status"] == "not_inference_server" and closed[str(web)]["finding"] is None
    assert closed[str(oom)]["status"] == "failed" and r.returncode == 1
    only_web = run([*cli, "stream", "--events", "closed,failed", str(web)])
    assert only_web.returncode == 0  # nothing failed


def test_include_and_exclude_by_source_or_label(cli) -> None:
    def shape(i: int, line: str, n: int) -> str:
        return f"[pod/server-{i}-7d9f/engine] {line}"

    data = "\n".join(_interleaved(shape)).encode() + b"\n"
    got = _verdicts(cli, ["--include", "pod=server-[01]-*", "--exclude", "server-1-*"], stdin=data)
    assert sorted(got) == ["server-0-7d9f/engine"]
    got = _verdicts(cli, ["--exclude", "container=engine"], stdin=data)
    assert got == {}


def test_sigterm_flushes_the_verdicts_held(cli) -> None:
    """A rollout's SIGTERM while input is still open: the closed verdicts come out first."""
    import signal
    import subprocess
    import time

    p = subprocess.Popen(
        [*cli, "stream", "--events", "closed"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdin is not None
    p.stdin.write("\n".join(_lines(LOGS[0])).encode() + b"\n")
    p.stdin.flush()
    time.sleep(3)  # read and held (the input is not ended)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    closed = [json.loads(x) for x in out.decode().splitlines()]
    assert [c["source"] for c in closed] == ["-"] and closed[0]["status"] == "failed", err
    assert p.returncode == 1 and b"Traceback" not in err


def test_the_node_agent_names_a_docker_container_by_its_id() -> None:
    from diagnose.fleet.node_agent import identity

    cid = "3f4e" * 16
    assert identity(f"/var/lib/docker/containers/{cid}/{cid}-json.log", "gpu-1") == (
        cid[:12],
        {"container_id": cid[:12], "node": "gpu-1"},
    )
    assert identity(f"/var/lib/docker/containers/{cid}/{cid}-json.log.1")[0] == cid[:12]


def test_two_servers_in_one_source_are_refused_not_merged(cli, tmp_path: Path) -> None:
    """A vLLM startup and an SGLang one interleaved in one plain file: each engine printed its
    own entry point's lines (vLLM's version banner, SGLang's ServerArgs), which no import
    prints — `stream` refuses the source (no merged verdict) and `scan` says so."""
    from .conftest import FIXTURES

    a = (FIXTURES / "logs" / "vllm" / "healthy-v1-serving.log").read_text().splitlines()
    b = (FIXTURES / "logs" / "sglang" / "oom-cuda-graph-capture.log").read_text().splitlines()
    rng = random.Random(3)
    lines: list[str] = []
    while a or b:
        src = a if a and (not b or rng.random() < 0.5) else b
        lines += src[:3]
        del src[:3]
    mixed = tmp_path / "mixed.log"
    mixed.write_text("\n".join(lines) + "\n")
    events = [
        json.loads(x)
        for x in run([*cli, "stream", "--events", "finding,failed,ready,closed", str(mixed)])
        .stdout.decode()
        .splitlines()
    ]
    assert events and all(e["status"] == "two_servers_in_one_source" for e in events)
    assert not any(e["event"] in ("failed", "ready") for e in events)
    scanned = json.loads(run([*cli, "scan", "--json", str(mixed)]).stdout)
    assert scanned["two_servers"] == ["sglang", "vllm"]
    assert "two servers in one log: sglang and vllm" in run([*cli, "scan", str(mixed)]).stdout.decode()
    # each alone: no such word
    alone = json.loads(
        run([*cli, "scan", "--json", str(FIXTURES / "logs" / "vllm" / "healthy-v1-serving.log")]).stdout
    )
    assert "two_servers" not in alone


FAST_JSON_CASES = [
    '{"message": "INFO 12-04 10:00:00 [core.py:1] ready", "kubernetes": {"pod_name": "a"}}',
    '{"message": "x", "n": NaN, "i": Infinity}',  # json accepts these, orjson does not
    '{"message": "x", "big": 123456789012345678901234567890}',  # past 64 bits
    '{"message": "x", "s": "\\ud800 lone surrogate"}',
    '{"message": "caf\\u00e9 \\u2603", "dup": 1, "dup": 2}',  # the last duplicate wins in both
    '{"message": 1.0000000000000002, "e": 1e400}',
    '{"message": "x", "low": -9223372036854775809, "high": 18446744073709551616, "ok": 9999999999999999999}',
    '{"message": "x", "inf": 1e400, "tiny": 0.1e-400}',
    '{"broken": ',
]


def test_fast_json_decodes_as_the_standard_library_does() -> None:
    from diagnose.fleet.record_shapes import fast_loads

    loads = fast_loads()
    for text in FAST_JSON_CASES:
        try:
            want: Any = json.loads(text)
        except ValueError:
            with pytest.raises(ValueError):
                loads(text)
            continue
        got = loads(text)
        assert repr(got) == repr(want), text  # repr: NaN is not equal to itself


def test_records_read_the_same_before_and_after_the_fast_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader switches to orjson after a few thousand JSON records: the records it gives
    are the same as with the standard library throughout."""
    import diagnose.fleet.record_shapes as shapes

    lines = [
        json.dumps(
            {"message": f"line {i} {t}", "kubernetes": {"pod_name": f"p{i % 7}", "pod_namespace": "n"}}
        )
        for i, t in enumerate(FAST_JSON_CASES * 40)
    ] + FAST_JSON_CASES * 40

    def records(after: int) -> list[tuple[Any, ...]]:
        monkeypatch.setattr(shapes, "FAST_JSON_AFTER", after)
        reader = RecordReader()
        return [(r.source, r.labels, r.lines, r.shape, r.time) for x in lines for r in reader.read(x, "in")]

    assert records(after=10) == records(after=10**9)
