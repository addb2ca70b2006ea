"""`probe --sweep`: the knee of a loopback server that batches like an engine, over real HTTP."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.base.errors import InputError
from diagnose.knowledge.engine_profiles import load_profiles
from diagnose.probe.sweep import percentile, read_metrics, run_sweep
from diagnose.probe.sweep_compare import compare_sweep, save_sweep

from .batching_stub import BatchingStub

ROOT = Path(__file__).resolve().parents[1]
LEVELS = [1, 2, 4, 8, 16]


def test_the_knee_is_found_within_one_step_and_kv_bounds_it():  # type: ignore[no-untyped-def]
    with BatchingStub(slots=4, limit="kv") as stub:
        s = run_sweep(stub.url, "stub-model", LEVELS, "hi", 32)
    assert [x.concurrency for x in s.steps] == LEVELS
    assert all(x.errors == 0 and x.requests == max(8, 2 * x.concurrency) for x in s.steps)
    assert s.knee is not None and abs(math.log2(s.knee) - math.log2(4)) <= 1
    assert s.bound == "kv"
    assert "gpu_memory_utilization" in (s.next_step or "")
    # beyond the slots the queue shows in /metrics and p99 TTFT climbs
    past = s.steps[LEVELS.index(16)]
    assert past.metrics["waiting"] > 0 and past.metrics["running"] == 4
    assert past.ttft_p99_ms > 5 * s.steps[0].ttft_p99_ms


def test_a_batch_cap_with_kv_to_spare_is_scheduler_bound():  # type: ignore[no-untyped-def]
    with BatchingStub(slots=8, limit="scheduler") as stub:
        s = run_sweep(stub.url, "stub-model", [2, 4, 8, 16, 32], "hi", 32)
    assert s.knee is not None and abs(math.log2(s.knee) - math.log2(8)) <= 1
    assert s.bound == "scheduler"
    assert "max_num_seqs" in (s.next_step or "")


def test_compare_flags_a_20_percent_slowdown_and_a_changed_output(tmp_path):  # type: ignore[no-untyped-def]
    base = tmp_path / "sweep.json"
    with BatchingStub(slots=4) as stub:
        before = run_sweep(stub.url, "stub-model", [1, 2, 4], "hi", 32)
        save_sweep(before, str(base), stub.url, "stub-model")
        stub.slow = 1.2  # every step a fifth slower: an upgrade that regressed
        after = run_sweep(stub.url, "stub-model", [1, 2, 4], "hi", 32)
        compare_sweep(after, str(base), 0.15)
        assert any("tpot_p" in r or "tok_per_s" in r for r in after.regressions), after.regressions
        stub.slow = 1.0
        stub.text = "other"  # same speed, different words at temperature 0
        changed = run_sweep(stub.url, "stub-model", [1], "hi", 32)
        compare_sweep(changed, str(base), 10.0)
    assert changed.regressions == [
        "concurrency 1: the fixed prompt's output changed (temperature 0): "
        "a kernel, dtype or version change alters results"
    ]
    saved = json.loads(base.read_text())
    assert saved["kind"] == "sweep" and saved["steps"][0]["output"].startswith("tok0 tok1")


def test_a_baseline_that_is_not_a_sweep_is_a_named_error(tmp_path):  # type: ignore[no-untyped-def]
    bad = tmp_path / "probe.json"
    bad.write_text('{"ttft_ms": 12.0}')
    from diagnose.probe.sweep import Sweep

    with pytest.raises(InputError, match="not a sweep baseline"):
        compare_sweep(Sweep(), str(bad), 0.1)


def test_the_request_bound_and_ctrl_c_keep_what_was_measured():  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match="over --max-requests 20"):
        run_sweep("http://127.0.0.1:9", None, [1, 2, 4, 8], "hi", 4, max_requests=20)

    def interrupt(done: int, total: int, c: int) -> None:
        if c == 4:
            raise KeyboardInterrupt

    with BatchingStub(slots=4) as stub:
        s = run_sweep(stub.url, "stub-model", [1, 2, 4, 8], "hi", 8, progress=interrupt)
    assert s.stopped == "stopped with Ctrl-C"
    assert [x.concurrency for x in s.steps] == [1, 2]


def test_read_metrics_knows_vllm_and_sglang_names():  # type: ignore[no-untyped-def]
    text = (
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 3.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct"} 2.0\n'
        'vllm:gpu_cache_usage_perc{model_name="Qwen/Qwen2.5-7B-Instruct"} 0.93\n'
        'vllm:num_preemptions_total{model_name="Qwen/Qwen2.5-7B-Instruct"} 17.0\n'
        'sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 41.0\n'
        'sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.99\n'
        "process_resident_memory_bytes 1.2e+09\n"
    )
    m = read_metrics(text, load_profiles().metrics)
    assert m["waiting"] == 46.0  # per-engine gauges summed (and SGLang's queue)
    assert m["preemptions"] == 17.0
    assert m["kv_usage"] == pytest.approx(0.99)  # the fullest: usage is no sum


def test_read_metrics_knows_tgi_routers_gauges():  # type: ignore[no-untyped-def]
    # text-generation-inference router (metrics-exporter-prometheus: no labels)
    text = (
        "# TYPE tgi_queue_size gauge\n"
        "tgi_queue_size 3\n"
        "# TYPE tgi_batch_current_size gauge\n"
        "tgi_batch_current_size 8\n"
        "# TYPE tgi_batch_current_max_tokens gauge\n"
        "tgi_batch_current_max_tokens 15000\n"
        "# TYPE tgi_batch_max_total_tokens gauge\n"
        "tgi_batch_max_total_tokens 16000\n"
        "tgi_request_count 120\n"
    )
    assert read_metrics(text, load_profiles().metrics) == {
        "waiting": 3.0,
        "running": 8.0,
        "kv_usage": 15000 / 16000,
    }


def test_percentile_is_nearest_rank():  # type: ignore[no-untyped-def]
    assert percentile([], 0.5) is None
    assert percentile([5.0, 1.0, 3.0], 0.5) == 3.0
    assert percentile([float(i) for i in range(1, 17)], 0.99) == 16.0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diagnose", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=120,
    )


def test_cli_sweep_json_and_text(tmp_path):  # type: ignore[no-untyped-def]
    with BatchingStub(slots=4) as stub:
        r = _cli("probe", stub.url, "--sweep", "1,2,4,8", "--max-tokens", "24", "--json")
        t = _cli("probe", stub.url, "--sweep", "1,2,4,8", "--max-tokens", "24")
    assert r.returncode == 0, r.stderr
    sw = json.loads(r.stdout)["sweep"]
    keys = {
        "concurrency",
        "requests",
        "errors",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "tpot_p50_ms",
        "tpot_p99_ms",
        "req_per_s",
        "tok_per_s",
    }
    assert all(keys <= set(step) for step in sw["steps"])
    assert sw["bound"] in ("kv", "scheduler", "compute", "unknown") and sw["knee"] in (2, 4, 8)
    assert t.returncode == 0 and "◀ knee" in t.stdout and "bound kv" in t.stdout


def test_cli_sweep_usage_errors():  # type: ignore[no-untyped-def]
    for args in (("--sweep", "4,2"), ("--sweep", "a,b"), ("--sweep", "0,1"), ("--compare", "x.json")):
        r = _cli("probe", "http://127.0.0.1:9", *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, args


# --- probe --long and degenerate output (guide 003's after-startup checks) -----------------------


def test_long_prompt_close_to_max_model_len_is_accepted_with_its_ttft():  # type: ignore[no-untyped-def]
    with BatchingStub(slots=2) as stub:
        stub.max_model_len = 2048
        r = _cli("probe", stub.url, "--long", "0", "--json")
        sent = stub.last_prompt_tokens
    out = json.loads(r.stdout)
    assert r.returncode == 0, r.stdout
    assert out["max_model_len"] == 2048
    assert out["long_prompt"]["accepted"] is True and out["long_prompt"]["ttft_ms"] is not None
    assert 2048 - 128 <= sent <= 2048 - 4  # close to the limit, room for the answer


def test_a_long_prompt_the_context_refuses_is_a_request_cause():  # type: ignore[no-untyped-def]
    with BatchingStub(slots=2) as stub:
        r = _cli("probe", stub.url, "--long", "6000", "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1
    assert out["long_prompt"] == {"tokens": 6000, "accepted": False, "status": 400, "ttft_ms": None}
    assert out["cause"]["class"] == "request"
    assert any("max_model_len 4096" in a for a in out["cause"]["advice"])


@pytest.mark.parametrize(
    ("text", "finish", "completion", "max_tokens", "want"),
    [
        ("The capital of France is Paris, known for the Eiffel Tower and its museums.", "stop", 16, 64, None),
        ("Sure! " + "the " * 14, "length", 16, 16, "the same token repeated 14 times"),
        (
            "Hello there: " + "I am a model. " * 6,
            "length",
            24,
            24,
            "the same phrase of 4 words repeated 6 times",
        ),
        ("你好！" + "我" * 13, "length", 16, 16, "the same token repeated 13 times"),
        ("你好！有什么可以帮你的吗？", "length", 16, 16, None),
        ("你好！有什么可以帮你的吗？", "length", 3, 16, "finish_reason 'length' after 3 of 16 tokens"),
    ],
)
def test_degenerate_output(text, finish, completion, max_tokens, want):  # type: ignore[no-untyped-def]
    from diagnose.probe.completion import degenerate

    got = degenerate(text, finish, completion, max_tokens)
    assert (got is None) if want is None else (got is not None and got.startswith(want)), got


def test_probe_flags_a_server_that_answers_in_a_loop():  # type: ignore[no-untyped-def]
    with BatchingStub(slots=2) as stub:
        stub.text = "loop"  # "loop0 loop1 …": distinct words, not a loop
        ok = _cli("probe", stub.url, "--max-tokens", "16", "--json")
        stub.repeat = True
        bad = _cli("probe", stub.url, "--max-tokens", "16", "--json")
    assert ok.returncode == 0, ok.stdout
    out = json.loads(bad.stdout)
    assert bad.returncode == 1
    assert any(c["name"] == "output" and not c["ok"] for c in out["checks"])
    assert "degenerate" in out["cause"]["title"]


def test_read_metrics_takes_the_value_not_the_timestamp():  # type: ignore[no-untyped-def]
    # Prometheus text may end a sample with its timestamp in ms; the value is the one before it
    text = 'vllm:num_requests_waiting{model_name="m"} 4 1712345678000\nvllm:num_requests_running 2\n'
    assert read_metrics(text, load_profiles().metrics) == {"waiting": 4.0, "running": 2.0}


def test_read_metrics_of_text_that_is_not_prometheus_is_empty():  # type: ignore[no-untyped-def]
    assert read_metrics("<html>not found</html>\n{{{", load_profiles().metrics) == {}


def test_an_unchanged_server_shows_no_regression_in_20_of_20_runs(tmp_path):  # type: ignore[no-untyped-def]
    """The run-to-run noise is judged, not reported: the floor, the bootstrap within the run
    and the repeats between runs. The same comparison still catches a fifth slower.

    Up to the knee (4 slots): past it, a p99 of 16 requests is one request's TTFT and flips by a
    whole queueing round (165 -> 323 ms at concurrency 8): on this shared 2-CPU machine that
    step was flagged in 3 of 5 full-suite runs in one day despite the guards, so it is not
    claimed here (the gap is in the issue log). The baseline is taken again every five runs and
    right before the slower server: the machine's drift is not what is under test."""
    base = tmp_path / "sweep.json"
    steps = [1, 2, 4]
    with BatchingStub(slots=4) as stub:

        def repeat(c):  # type: ignore[no-untyped-def]
            return run_sweep(stub.url, "stub-model", [c], "hi", 32).steps[0]

        def baseline() -> None:
            save_sweep(run_sweep(stub.url, "stub-model", steps, "hi", 32), str(base), stub.url, "stub-model")

        flagged = []
        for i in range(20):
            if i % 5 == 0:
                baseline()
            again = run_sweep(stub.url, "stub-model", steps, "hi", 32)
            compare_sweep(again, str(base), 0.15, repeat)
            flagged += again.regressions
        assert flagged == []
        baseline()
        stub.slow = 1.2
        slower = run_sweep(stub.url, "stub-model", steps, "hi", 32)
        compare_sweep(slower, str(base), 0.15, repeat)
    assert any("tpot_p50_ms" in r or "tok_per_s" in r for r in slower.regressions), slower.regressions
    saved = json.loads(base.read_text())
    assert len(saved["steps"][0]["samples"]["ttft_ms"]) == saved["steps"][0]["requests"]
