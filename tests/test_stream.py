"""The streaming library API (diagnose.stream), called as a user's program would: a session
fed a log line by line (or bytes cut anywhere) ends on the same diagnosis as `scan` on the
file, emits its events as the log goes, and many interleaved sessions keep apart."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from diagnose.pipeline.scan import scan_paths
from diagnose.stream.session import (
    EVENT_KINDS,
    FEED_BYTES,
    SCHEMA,
    Event,
    Sessions,
    StreamSession,
    scan_lines,
)

from .conftest import FIXTURES, REAL_LOGS

FIXTURE_LOGS = sorted((FIXTURES / "logs").glob("*/*.log"))
REAL = sorted(REAL_LOGS.glob("*/log.txt")) if REAL_LOGS.is_dir() else []


def _comparable(doc: dict, path: Path) -> dict:
    doc = json.loads(json.dumps(doc).replace(str(path), "LOG"))
    doc["kb"] = []  # the incident store is the scan command's join, not the stream's
    for c in doc.get("advice") or []:
        if "port" in c["param"]:  # a scan asks this host which ports are free and who holds one;
            c["to"], c["why"], c["flag"] = "<port>", "<host>", "<flag>"  # a stream's server ran elsewhere
    return doc


def _stream_file(know, path: Path, cuts: random.Random | None = None) -> tuple[dict, list[Event]]:
    s = StreamSession(str(path), know)
    events: list[Event] = []
    data = path.read_bytes()
    if cuts is None:
        for line in data.splitlines(keepends=True):
            events += s.feed(line)
    else:  # bytes cut anywhere, as a socket delivers them
        pos = 0
        while pos < len(data):
            step = cuts.randint(1, 5000)
            events += s.feed(data[pos : pos + step])
            pos += step
    events += s.close()
    return s.diagnosis().to_json(), events


@pytest.mark.parametrize("log", FIXTURE_LOGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_session_fed_line_by_line_ends_on_the_scan_diagnosis(know, log: Path) -> None:
    got, events = _stream_file(know, log)
    want = scan_paths([str(log)], know).to_json()
    assert _comparable(got, log) == _comparable(want, log)
    assert events[-1].kind == "closed" and events[-1].status == want["status"]


@pytest.mark.skipif(not REAL, reason="../shared/real-logs is absent")
def test_real_logs_streamed_in_bytes_cut_anywhere_end_as_scan_says(know) -> None:
    """Every fourth real log (the suite's time), cut at random byte offsets."""
    rng = random.Random(7)
    for log in REAL[::4]:
        got, _ = _stream_file(know, log, cuts=rng)
        want = scan_paths([str(log)], know).to_json()
        assert _comparable(got, log) == _comparable(want, log), log.parent.name


def test_events_of_a_kv_cache_crash_come_in_order_with_the_change(know) -> None:
    log = FIXTURES / "logs" / "vllm" / "kv-cache-too-small-v1.log"
    _, events = _stream_file(know, log)
    kinds = [e.kind for e in events]
    assert set(kinds) <= set(EVENT_KINDS)
    assert kinds.count("failed") == 1 and kinds[-1] == "closed"
    phases = [e.phase for e in events if e.kind == "phase"]
    assert "load_weights" in phases and phases == sorted(phases, key=phases.index)
    failed = next(e for e in events if e.kind == "failed")
    assert failed.finding is not None and failed.finding["class"] == "kv_cache_too_small"
    assert failed.change is not None and failed.change["flag"] == "--max-model-len"
    line = failed.to_json()
    assert line["schema"] == SCHEMA and line["event"] == "failed" and line["status"] == "failed"
    json.dumps(line)  # one JSON line, nothing that does not serialise


def test_a_healthy_server_says_ready_once(know) -> None:
    log = FIXTURES / "logs" / "tgi" / "healthy-connected.log"
    _, events = _stream_file(know, log)
    assert [e.kind for e in events].count("ready") == 1
    assert not [e for e in events if e.kind in ("failed", "hang")]


def test_lines_are_held_at_most_a_block_before_they_are_scanned(know) -> None:
    s = StreamSession("a", know)
    for _ in range(2000):
        s.feed_line("INFO 06-05 06:17:26 [core.py:12] nothing to see here")
        assert s.pending_bytes <= FEED_BYTES + 100
    assert s.lines > 0  # scanned a block at a time, not at the end
    s.flush()
    assert s.pending_bytes == 0 and s.lines == 2000


def test_a_busy_source_is_read_a_block_or_a_hold_at_a_time_and_a_quiet_one_at_the_next_tick(know) -> None:
    """With `hold_s`, a tick leaves a source that is still writing its pending lines (reading a
    second's few lines of a thousand sources costs more than the lines), until they are
    `hold_s` old; a source that wrote nothing since the last tick, as a server that just died,
    is read at once, and its failure comes then."""
    now = [0.0]
    sessions = Sessions(know, clock=lambda: now[0], hold_s=10.0)
    crash = (FIXTURES / "logs" / "vllm" / "kv-cache-too-small-v1.log").read_text().splitlines()
    for i, line in enumerate(crash[:10]):
        sessions.feed_line("busy", f"INFO 06-05 06:17:{i:02d} [core.py:12] request {i} done")
        sessions.feed_line("dying", line)
    now[0] = 1.0
    sessions.feed_line("busy", "INFO 06-05 06:17:30 [core.py:12] request done")
    sessions.tick()  # the first tick: both wrote since the start
    busy, dying = sessions.get("busy"), sessions.get("dying")
    assert busy.lines == 0 and dying.lines == 0
    for line in crash[10:]:  # the rest of the crash, then nothing more from that server
        sessions.feed_line("dying", line)
    sessions.feed_line("busy", "INFO 06-05 06:17:31 [core.py:12] request done")
    now[0] = 2.0
    sessions.tick()
    assert busy.lines == 0 and dying.lines == 0  # both wrote since the last tick
    sessions.feed_line("busy", "INFO 06-05 06:17:32 [core.py:12] request done")
    now[0] = 5.0
    events = sessions.tick()  # the dying server went quiet: read now, its failure told
    assert dying.lines == len(crash) and busy.lines == 0
    sessions.feed_line("busy", "INFO 06-05 06:17:33 [core.py:12] request done")
    now[0] = 8.0  # after the cause's grace
    events += sessions.tick()
    assert [e.kind for e in events if e.source == "dying"].count("failed") == 1
    assert busy.lines == 0  # still writing, its oldest line 8 s old
    sessions.feed_line("busy", "INFO 06-05 06:17:34 [core.py:12] request done")
    now[0] = 10.0
    sessions.tick()
    assert busy.lines == 15  # held ten seconds at most
    assert Sessions(know).hold_s == 0.0  # a library caller's tick reads everything


def test_many_interleaved_sources_each_get_their_own_verdict(know) -> None:
    logs = {
        "ns/oom": FIXTURES / "logs" / "vllm" / "kv-cache-too-small-v1.log",
        "ns/healthy": FIXTURES / "logs" / "tgi" / "healthy-connected.log",
        "ns/port": FIXTURES / "logs" / "tgi" / "port-in-use.log",
    }
    pending = {k: p.read_text(encoding="utf-8").splitlines() for k, p in logs.items()}
    sessions = Sessions(know)
    rng = random.Random(3)
    while any(pending.values()):
        source = rng.choice([k for k, v in pending.items() if v])
        sessions.feed_line(source, pending[source].pop(0), labels={"pod": source.split("/")[1]})
    final = {e.source: e for e in sessions.close_all() if e.kind == "closed"}
    for source, path in logs.items():
        want = scan_paths([str(path)], know)
        assert final[source].status == want.status, source
        assert (final[source].finding or {}).get("rule") == (want.primary.rule if want.primary else None)
        assert final[source].labels == {"pod": source.split("/")[1]}
    assert len(sessions) == 0


def test_beyond_max_sessions_the_idlest_is_closed_with_its_verdict(know) -> None:
    sessions = Sessions(know, max_sessions=2)
    sessions.feed_line("a", "INFO starting")
    sessions.feed_line("b", "INFO starting")
    sessions.feed_line("a", "INFO still here")  # a is now the more recent
    events = sessions.feed_line("c", "INFO starting")
    assert [(e.kind, e.source) for e in events] == [("closed", "b")]
    assert "b" not in sessions and len(sessions) == 2 and sessions.evicted == 1


def test_idle_sessions_expire(know) -> None:
    now = [0.0]
    sessions = Sessions(know, idle_s=60, clock=lambda: now[0])
    sessions.feed_line("old", "INFO starting")
    now[0] = 50
    sessions.feed_line("new", "INFO starting")
    now[0] = 100
    closed = [e.source for e in sessions.tick() if e.kind == "closed"]
    assert closed == ["old"] and "new" in sessions


def test_a_phase_stuck_past_its_budget_is_a_hang(know) -> None:
    now = [0.0]
    s = StreamSession("pod", know, budgets={"load_weights": 30}, clock=lambda: now[0])
    s.feed_line("INFO 06-05 06:17:00 [api_server.py:1] vLLM API server version 0.10.1.1")
    s.feed_line(
        "INFO 06-05 06:17:01 [gpu_model_runner.py:1] Starting to load model meta-llama/Llama-3.1-8B-Instruct..."
    )
    assert not [e for e in s.tick() if e.kind == "hang"]
    now[0] = 100
    hang = [e for e in s.tick() if e.kind == "hang"]
    assert len(hang) == 1 and hang[0].finding["class"] == "hang" and hang[0].phase == "load_weights"
    assert not [e for e in s.tick() if e.kind == "hang"]  # said once


def test_a_closed_session_refuses_more_lines(know) -> None:
    s = StreamSession("x", know)
    s.close()
    with pytest.raises(ValueError, match="closed"):
        s.feed_line("more")


def test_scan_lines_is_the_one_call_form(know) -> None:
    log = FIXTURES / "logs" / "vllm" / "kv-cache-too-small-v1.log"
    d = scan_lines(log.read_text(encoding="utf-8").splitlines(), str(log), know)
    assert d.status == "failed" and d.primary is not None and d.primary.cls == "kv_cache_too_small"


def test_the_wrappers_one_session_learns_are_its_own(know) -> None:
    """Each source's lines behind a wrapper no layout knows (a custom logger's); opening more
    sessions must not make an open one forget its wrapper."""
    log = (FIXTURES / "logs" / "vllm" / "kv-cache-too-small-v1.log").read_text(encoding="utf-8").splitlines()
    sessions = Sessions(know)
    for i, line in enumerate(log):
        sessions.feed_line("a", f"pod-a | stdout | {line}")
        if i % 5 == 0:  # new sources keep opening while a is read
            sessions.feed_line(f"other-{i}", f"[worker-{i}] <info> starting")
        sessions.feed_line("b", f"node=b ts=0 msg: {line}")
    final = {e.source: e for e in sessions.close_all() if e.kind == "closed"}
    want = scan_paths([str(FIXTURES / "logs" / "vllm" / "kv-cache-too-small-v1.log")], know)
    for source in ("a", "b"):
        assert final[source].status == want.status and final[source].finding["rule"] == want.primary.rule
        assert final[source].change["to"] == want.advice[0].to
