"""probe against real HTTP on loopback: a stub OpenAI-compatible server with failure modes."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from diagnose.probe.baseline import compare_baseline, save_baseline
from diagnose.probe.completion import probe
from diagnose.probe.result import Timeouts

from .conftest import ROOT, run
from .openai_stub import Stub

FAST = Timeouts(connect=5, first_byte=1.0, idle=10)  # generous: a busy CI machine must not trip them


def names_failed(res):
    return [c.name for c in res.checks if not c.ok]


def test_good_server_passes_every_check():
    with Stub("good") as s:
        res = probe(s.url, timeouts=FAST)
    assert res.ok, res.checks
    assert res.model == "Qwen/Qwen2.5-7B-Instruct" and res.text and res.finish_reason == "stop"
    assert res.usage == {"prompt_tokens": 2, "completion_tokens": 7, "total_tokens": 9}
    assert res.ttft_ms is not None and res.total_ms >= res.ttft_ms and res.tokens_per_s > 0
    assert {c.name for c in res.checks} >= {
        "connect",
        "status",
        "json",
        "text",
        "finish_reason",
        "usage",
        "stream",
        "ttft",
        "total",
        "idle gap",
    }


def test_nothing_listening():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connection refused
        res = probe(f"http://127.0.0.1:{port}", timeouts=FAST)
    assert not res.ok and names_failed(res) == ["connect"] and "nothing is listening" in res.cause.title


@pytest.mark.parametrize(
    "mode,failed,cause",
    [
        ("invalid_json", ["json"], "not with JSON"),
        ("empty_text", ["text"], "shape is wrong"),
        ("model_not_found", ["status"], "does not know the model"),
        ("context_length", ["status"], "does not fit the context"),
        ("http500", ["status"], "HTTP 500"),
        ("dropped_stream", ["stream"], "stream was cut"),
    ],
)
def test_failure_modes_map_to_causes(mode, failed, cause):
    with Stub(mode) as s:
        res = probe(s.url, timeouts=FAST)
    assert not res.ok and names_failed(res) == failed and cause in res.cause.title
    assert res.cause.advice


def test_slow_first_byte_times_out_and_is_retried_once():
    with Stub("slow_first_byte", delay=2.5) as s:
        res = probe(s.url, timeouts=FAST)
        assert s.requests == 2
    assert names_failed(res) == ["first byte"] and res.cause.cls == "hang"
    assert any("retried once" in n for n in res.notes)


def test_cold_first_request_then_fine():
    with Stub("slow_once", delay=2.0) as s:
        res = probe(s.url, timeouts=FAST)
    assert res.ok and any("cold first request" in n for n in res.notes)


def test_baseline_roundtrip_and_regression(tmp_path):
    base = tmp_path / "base.json"
    with Stub("good") as s:
        res = probe(s.url, timeouts=FAST)
        save_baseline(res, str(base))
        data = json.loads(base.read_text())
        assert set(data) >= {"ttft_ms", "total_ms", "tokens_per_s"}
        data["ttft_ms"] = res.ttft_ms / 10  # pretend it used to be ten times faster
        # and far slower in total and in tokens/s (a thousand times: a busy machine's jitter on
        # a loopback stub is no regression): only the first-token time can regress
        data["total_ms"] = res.total_ms * 1000
        data["tokens_per_s"] = res.tokens_per_s / 1000
        base.write_text(json.dumps(data))
        res2 = probe(s.url, timeouts=FAST)
    compare_baseline(res2, str(base), 0.25)
    assert names_failed(res2) == ["baseline ttft_ms"] and res2.cause.title == "slower than the baseline"


def test_cli_json_and_exit_codes(cli, tmp_path):
    with Stub("good", first_byte=0.2, pace=0.05) as s:  # steady timings: the second run compares to the first
        p = subprocess.run(
            [*cli, "probe", s.url, "--json", "--save-baseline", str(tmp_path / "b.json")],
            capture_output=True,
            timeout=60,
            cwd=ROOT,
        )
        doc = json.loads(p.stdout)
        assert p.returncode == 0 and doc["ok"] is True and doc["model"] == "Qwen/Qwen2.5-7B-Instruct"
        assert {
            "ok",
            "url",
            "model",
            "checks",
            "text",
            "finish_reason",
            "usage",
            "ttft_ms",
            "total_ms",
            "tokens_per_s",
            "cause",
        } <= set(doc)
        assert all({"name", "ok", "value", "detail"} <= set(c) for c in doc["checks"])
        p = subprocess.run(
            [*cli, "probe", s.url, "--baseline", str(tmp_path / "b.json")],
            capture_output=True,
            timeout=60,
            cwd=ROOT,
        )
        assert p.returncode == 0 and "✓ serves" in p.stdout.decode()
    with Stub("model_not_found") as s:
        p = subprocess.run(
            [*cli, "probe", s.url, "--model", "nope"], capture_output=True, timeout=60, cwd=ROOT
        )
    out = p.stdout.decode()
    assert p.returncode == 1 and "--served-model-name" in out
    p = subprocess.run([*cli, "probe", "localhost:8000"], capture_output=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and b"Traceback" not in p.stderr


def test_a_server_that_wants_a_key_says_so_and_the_key_gets_in():
    with Stub("auth") as s:
        res = probe(s.url, timeouts=FAST)
        assert not res.ok and "wants credentials (HTTP 401)" in res.cause.title
        assert any("--api-key" in a for a in res.cause.advice)
        res = probe(s.url, timeouts=FAST, api_key="sk-test-key")
        assert res.ok


def test_a_name_that_does_not_resolve_is_not_a_closed_port():
    res = probe("http://no-such-host.invalid:8000", timeouts=FAST)
    assert not res.ok and "does not resolve" in res.cause.title


def test_cli_key_from_env_and_timings_in_the_text(cli):
    with Stub("auth") as s:
        p = run([*cli, "probe", s.url, "--max-tokens", "4"], env={"OPENAI_API_KEY": "sk-test-key"})
        out = p.stdout.decode()
        assert p.returncode == 0, out
        assert "TTFT" in out and "tokens/s" in out
        p = run(
            [*cli, "probe", s.url, "--header", "X-Api-Key: nope", "--max-tokens", "4"],
            env={"OPENAI_API_KEY": ""},
        )
        assert p.returncode == 1 and b"wants credentials" in p.stdout


def test_an_error_the_server_answers_gets_the_scans_own_change():
    """One knowledge and one change type: the context-length error vLLM answers with is read by
    the scan's rules, and its change is the scan's (a request within the context)."""
    with Stub("context_length") as s:
        res = probe(s.url, timeouts=FAST)
    assert res.cause is not None and res.cause.changes, res.cause
    first = res.cause.changes[0]
    assert first.param in ("max_tokens", "max_model_len") and first.verify
    doc = res.to_json()["cause"]
    assert doc["changes"][0]["param"] == first.param and "to" in doc["changes"][0]
