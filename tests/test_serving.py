"""The serving phase: the engines' stats lines as a series, and the verdict on it.

The stats lines are the engines' own wordings (reference catalogues, real logs); the
startups in front of them are the shipped fixtures with their own stats lines taken out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from diagnose.match.scanner import Scanner
from diagnose.match.serving_series import SAMPLE_MAX, SeriesSampler, judge, read_points

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "logs"
REAL = ROOT.parent / "shared" / "real-logs"
STATS_NEEDLES = ("KV cache usage", "Decode batch", "Prefill batch")


def startup(name: str, replace: tuple[str, str] | None = None) -> list[str]:
    """A shipped fixture's startup and requests, without its own stats lines."""
    lines = [x for x in (FIXTURES / name).read_text().splitlines() if not any(n in x for n in STATS_NEEDLES)]
    if replace:
        lines = [x.replace(*replace) for x in lines]
    return lines


def vllm_v0_stats(i: int, running: int, pending: int, kv: float, gen: float = 7154.5) -> str:
    # vllm/engine/metrics.py, 0.6.x: every 5 s
    return (
        f"INFO 12-01 07:{i // 12:02d}:{i * 5 % 60:02d} metrics.py:349] Avg prompt throughput: 0.0 tokens/s, "
        f"Avg generation throughput: {gen:.1f} tokens/s, Running: {running} reqs, Swapped: 0 reqs, "
        f"Pending: {pending} reqs, GPU KV cache usage: {kv * 100:.1f}%, CPU KV cache usage: 0.0%."
    )


def vllm_v1_stats(i: int, running: int, waiting: int, kv: float, preemptions: int | None = None) -> str:
    # vllm/v1/metrics/loggers.py, 0.15 to 0.25: every 10 s, `Preemptions` when there were some
    pre = f"Preemptions: {preemptions}, " if preemptions is not None else ""
    return (
        f"(APIServer pid=2107) INFO 06-05 07:{i // 6:02d}:{i * 10 % 60:02d} [loggers.py:127] Engine 000: "
        f"Avg prompt throughput: 120.0 tokens/s, Avg generation throughput: 812.4 tokens/s, Running: {running} reqs, "
        f"Waiting: {waiting} reqs, {pre}GPU KV cache usage: {kv * 100:.1f}%, Prefix cache hit rate: 12.0%"
    )


def sglang_decode(i: int, running: int, queue: int, usage: float, gen: float) -> str:
    # python/sglang/srt/managers/scheduler_metrics_mixin.py, 0.5.x
    return (
        f"[2025-01-23 19:{40 + i // 60:02d}:{i % 60:02d} TP0] Decode batch, #running-req: {running}, "
        f"#token: {int(usage * 441520)}, token usage: {usage:.2f}, cuda graph: True, "
        f"gen throughput (token/s): {gen:.2f}, #queue-req: {queue}, "
    )


def diagnose_lines(know, lines: list[str], tmp_path: Path, name: str = "run.log"):  # type: ignore[no-untyped-def]
    from diagnose.pipeline.scan import scan_paths

    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return scan_paths([str(p)], know)


# --- reading the lines -----------------------------------------------------------------------


WORDINGS = [
    (
        "vllm",
        "INFO 10-28 11:16:39 metrics.py:349] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
        "7154.5 tokens/s, Running: 61 reqs, Swapped: 0 reqs, Pending: 98 reqs, GPU KV cache usage: 99.1%, "
        "CPU KV cache usage: 0.0%.",
        {"running": 61, "waiting": 98, "swapped": 0, "kv_usage": 0.991, "gen_tps": 7154.5},
    ),
    (
        "vllm",
        "INFO 01-10 10:00:00 metrics.py:467] Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: "
        "50.0 tokens/s, Running: 2 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 1.5%, CPU KV "
        "cache usage: 0.0%, Prefix cache hit rate: GPU: 45.00%, CPU: 0.00%",
        {"running": 2, "waiting": 0, "kv_usage": 0.015, "prefix_hit": 0.45},
    ),
    (
        "vllm",
        "(APIServer pid=1) INFO 05-01 10:00:10 [loggers.py:127] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
        "Avg generation throughput: 812.4 tokens/s, Running: 64 reqs, Waiting: 30 reqs, Preemptions: 12, "
        "GPU KV cache usage: 99.6%, Prefix cache hit rate: 0.0%",
        {"running": 64, "waiting": 30, "preemptions": 12, "kv_usage": 0.996, "prefix_hit": 0.0},
    ),
    (
        "vllm",
        "(APIServer pid=1) INFO 11-01 10:00:10 [loggers.py:248] 2 Engines Aggregated: Avg prompt throughput: "
        "5.0 tokens/s, Avg generation throughput: 80.0 tokens/s, Running: 3 reqs, Waiting: 0 reqs, Deferred: 0 "
        "reqs, XPU KV cache usage: 4.2%",
        {"running": 3, "waiting": 0, "kv_usage": 0.042, "gen_tps": 80.0},
    ),
    (
        "sglang",
        "[2025-01-23 19:40:00 TP0] Decode batch. #running-req: 120, #token: 441000, token usage: 0.99, cuda "
        "graph: True, gen throughput (token/s): 1822.10, #queue-req: 41",
        {"running": 120, "waiting": 41, "kv_usage": 0.99, "gen_tps": 1822.1},
    ),
    (
        "sglang",
        "[2025-10-20 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: "
        "0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput "
        "(token/s): 512.40",
        {"running": 0, "waiting": 0, "kv_usage": 0.0, "prompt_tps": 512.4},
    ),
    (
        "sglang",
        "[03:51:54] Decode batch, #running-req: 6, #full token: 2435072, full token usage: 0.92, swa token "
        "usage: 0.09, gen throughput (token/s): 24.33",
        {"running": 6, "kv_usage": 0.92, "gen_tps": 24.33},
    ),
    (
        "lmdeploy",
        "[2025-09-01 10:00:00 DP0] Avg prompt throughput: 512.0 tokens/s, Avg generation throughput: 96.4 "
        "tokens/s, Finished: 3 reqs, Unfinished: 5 reqs, Running: 5 reqs, Waiting: 0 reqs, GPU KV cache usage: 12.5%",
        {"running": 5, "waiting": 0, "kv_usage": 0.125, "prompt_tps": 512.0, "gen_tps": 96.4},
    ),
    (
        "lmdeploy",
        "[2025-12-01 10:00:00 DP0] Avg thr (in/out): 512.0 / 96.4 tokens/s, Server (succeeded/failed/routed/"
        "waiting): 3 / 0 / 8 / 0, Engine (running/waiting): 5 / 2, KV cache: 12.5%, Prefix cache hit rate: 40.0%, ",
        {
            "running": 5,
            "waiting": 2,
            "kv_usage": 0.125,
            "prompt_tps": 512.0,
            "gen_tps": 96.4,
            "prefix_hit": 0.4,
        },
    ),
]


@pytest.mark.parametrize(
    ("engine", "text", "want"), WORDINGS, ids=[f"{e}-{i}" for i, (e, _, _) in enumerate(WORDINGS)]
)
def test_each_wording_reads_its_fields(know, engine, text, want):  # type: ignore[no-untyped-def]
    markers = sorted(know.profiles.series, key=lambda m: m.engine != engine)
    (point,) = read_points([("log", 7, text.encode())], markers, know.profiles.layout)
    assert point.line == 7
    for k, v in want.items():
        assert point.values[k] == pytest.approx(v), k


def test_every_series_marker_example_gives_two_fields(know):  # type: ignore[no-untyped-def]
    assert {m.engine for m in know.profiles.series} >= {"vllm", "sglang", "lmdeploy"}
    for m in know.profiles.series:
        for ex in m.examples:
            assert len(m.read(ex)) >= 2, ex


def test_a_series_field_with_two_groups_is_refused(tmp_path):  # type: ignore[no-untyped-def]
    from diagnose.knowledge.engine_profiles import parse_profile

    data = {
        "engine": "mine",
        "series": [
            {"needles": ["load:"], "fields": {"running": "run (\\d+)/(\\d+)"}, "examples": ["load: run 1/2"]}
        ],
    }
    prof = parse_profile(data, str(tmp_path / "mine.yaml"))
    assert prof.series == []
    assert "mine.series[0]" in prof.problems[0] and "fields.running" in prof.problems[0]


# --- the sample stays bounded and spread ----------------------------------------------------


def test_sampler_is_bounded_spread_and_keeps_the_latest():  # type: ignore[no-untyped-def]
    s = SeriesSampler()
    for i in range(1, 100_001):
        if s.take():  # as the scanner feeds it
            s.keep("log", i, b"x")
        s.last("log", i, b"x")
    pts = s.snapshot()
    assert len(pts) <= SAMPLE_MAX + 1
    assert pts[0][1] == 1 and pts[-1][1] == 100_000
    gaps = {b[1] - a[1] for a, b in pairwise(pts[:-1])}
    assert len(gaps) == 1  # evenly spaced over the whole log
    assert s.seen == 100_000


def test_a_blocks_stats_lines_are_sampled_as_one_at_a_time():  # type: ignore[no-untyped-def]
    """`collect` picks a block's kept lines by arithmetic: the same points, count and latest as
    `take` asked line by line, across blocks of any size and lines holding two wordings."""
    import random

    needles = [b"Avg prompt throughput", b"KV cache usage"]
    rng = random.Random(7)
    lines = [
        rng.choice(
            [
                b"Avg prompt throughput: 1 KV cache usage: 2% KV cache usage: 0%",
                b"noise",
                b"KV cache usage: 5%",
            ]
        )
        for _ in range(5_000)
    ]
    ref = SeriesSampler()
    for number, raw in enumerate(lines, 1):
        if any(n in raw for n in needles):
            if ref.take():
                ref.keep("log", number, raw)
            ref.last("log", number, raw)
    got, base, i = SeriesSampler(), 0, 0
    while i < len(lines):
        k = rng.choice([1, 3, 50, 700])
        got.collect(b"\n".join(lines[i : i + k]) + b"\n", base, "log", needles)
        base, i = base + len(lines[i : i + k]), i + k
    assert (got.points, got.seen, got.latest, got.stride) == (ref.points, ref.seen, ref.latest, ref.stride)
    assert got.stride > 1  # the sample filled and thinned on the way


def test_scanner_series_has_the_right_line_numbers_and_stays_flat(know):  # type: ignore[no-untyped-def]
    scanner = Scanner(know.rules, know.profiles)
    scanner.set_source("big.log")
    lines = []
    for i in range(60_000):
        lines.append(f'INFO:     10.0.0.1:{40000 + i % 999} - "POST /v1/completions HTTP/1.1" 200 OK')
        lines.append(vllm_v1_stats(i % 300, 4 + i % 7, 0, 0.1 + (i % 50) / 100))
    data = ("\n".join(lines) + "\n").encode()
    k = 0
    while k < len(data):  # blocks of whole lines, as read_blocks gives them
        end = data.find(b"\n", k + (1 << 20))
        end = len(data) if end < 0 else end + 1
        scanner.feed(data[k:end])
        k = end
    result = scanner.finish()
    assert result.series_seen == 60_000
    assert len(result.series) <= SAMPLE_MAX + 1
    for _, number, raw in result.series:
        assert lines[number - 1].encode() == raw  # the line number is the stats line's own


def test_a_live_scan_reads_each_sampled_stats_line_once(know):  # type: ignore[no-untyped-def]
    """A stream asks for its diagnosis again and again: the stats lines read by an earlier
    diagnosis are not split and read again (their readings are kept for the lines still
    sampled), and the points are those a fresh reading gives."""
    markers = sorted(know.profiles.series, key=lambda m: m.engine != "vllm")
    raw = [("s", 2 * i + 1, vllm_v1_stats(i, 4 + i % 7, i % 3, 0.5).encode()) for i in range(40)]
    layout = know.profiles.layout
    splits = layout._splits
    cache: dict = {}
    first = read_points(raw[:30], markers, layout, cache=cache)
    before = splits[0]
    again = read_points(raw, markers, layout, cache=cache)
    assert splits[0] - before == 10  # only the ten new lines were split
    assert again == read_points(raw, markers, layout) and again[:30] == first
    again[0].text = ""  # the caller may clear a point's text (serving_of does): the reading keeps it
    assert read_points(raw[:1], markers, layout, cache=cache)[0].text.startswith("Engine 000:")
    assert [key[1:] for key in cache] == [("s", 1)]  # only the lines sampled now are kept


# --- the verdicts ----------------------------------------------------------------------------


def test_kv_full_with_a_persisting_queue_is_kv_bound_and_a_preemption_finding(know, tmp_path):  # type: ignore[no-untyped-def]
    lines = startup("vllm/healthy-v0-tp2-serving.log") + [
        vllm_v0_stats(i, 60 + i % 3, 90 + i, 0.95 + (i % 5) / 100) for i in range(14)
    ]
    d = diagnose_lines(know, lines, tmp_path)
    assert d.serving.verdict == "kv_bound"
    assert d.status == "degraded"
    assert d.primary.rule == "serving.kv-bound" and d.primary.cls == "preemption"
    assert d.primary.facts["waiting"] >= 90
    assert d.advice and d.advice[0].param in ("max_num_seqs", "gpu_memory_utilization", "kv_cache_dtype")
    assert "14 of 14 stats lines" in d.serving.why
    # only the evidence line's text is quoted (and redacted); the other points keep numbers only
    assert (
        d.serving.evidence.text
        and [p.text for p in d.serving.points if p is not d.serving.evidence] == [""] * 13
    )


def test_one_long_request_filling_the_cache_for_seconds_is_not_kv_bound(know, tmp_path):  # type: ignore[no-untyped-def]
    # SGLang logs a decode line every 40 steps: six lines in five seconds of one 24k-token request
    lines = startup("sglang/healthy-tp2-serving.log") + [
        sglang_decode(i, 1, 1 if i < 3 else 0, 0.97, 74.5) for i in range(6)
    ]
    d = diagnose_lines(know, lines, tmp_path)
    assert d.serving.verdict != "kv_bound"
    assert d.status == "ready"


def test_a_preemption_storm_in_v1_stats(know, tmp_path):  # type: ignore[no-untyped-def]
    lines = startup("vllm/healthy-v1-serving.log") + [
        vllm_v1_stats(i, 256, 30 + i, 0.996, preemptions=5 + i) for i in range(6)
    ]
    d = diagnose_lines(know, lines, tmp_path)
    assert d.serving.verdict == "preemption_storm"
    assert d.status == "degraded" and d.primary.cls == "preemption"
    assert d.serving.summary["preemptions"] == sum(5 + i for i in range(6))


def test_running_pinned_at_the_cap_with_kv_to_spare_is_scheduler_bound(know, tmp_path):  # type: ignore[no-untyped-def]
    lines = startup(
        "sglang/healthy-tp2-serving.log", ("max_running_requests=4097", "max_running_requests=32")
    ) + [sglang_decode(i * 5, 32, 10 + i, 0.41, 1900.0) for i in range(12)]
    d = diagnose_lines(know, lines, tmp_path)
    assert d.serving.verdict == "scheduler_bound"
    assert "max_num_seqs above 32" in d.serving.next_step
    assert d.status == "ready"  # a tuning matter, told in the serving block, not a failure


def test_no_queue_a_small_batch_and_an_idle_cache_is_client_bound(know, tmp_path):  # type: ignore[no-untyped-def]
    lines = startup("vllm/healthy-v1-serving.log") + [vllm_v1_stats(i, 1 + i % 2, 0, 0.02) for i in range(8)]
    d = diagnose_lines(know, lines, tmp_path)
    assert d.serving.verdict == "client_bound"
    assert "client" in d.serving.next_step
    assert d.status == "ready"


def test_no_request_in_any_line_is_idle_and_two_lines_say_nothing(know, tmp_path):  # type: ignore[no-untyped-def]
    idle = diagnose_lines(
        know,
        startup("vllm/healthy-v0-tp2-serving.log") + [vllm_v0_stats(i, 0, 0, 0.0, gen=0.0) for i in range(5)],
        tmp_path,
        "idle.log",
    )
    assert idle.serving.verdict == "idle"
    two = diagnose_lines(
        know,
        startup("vllm/healthy-v0-tp2-serving.log") + [vllm_v0_stats(i, 9, 9, 0.99) for i in range(2)],
        tmp_path,
    )
    assert two.serving.verdict == "unknown" and two.status == "ready"


def test_generation_per_request_collapsing_under_a_steady_batch(know, tmp_path):  # type: ignore[no-untyped-def]
    lines = startup("sglang/healthy-tp2-serving.log") + [
        sglang_decode(i * 5, 16, 0, 0.5, 800.0 if i < 8 else 90.0) for i in range(14)
    ]
    d = diagnose_lines(know, lines, tmp_path)
    assert d.serving.verdict == "throughput_collapse"
    per = d.serving.summary["per_request_tps"]
    assert per["after"] < 0.4 * per["before"]
    assert d.status == "ready"  # the KV cache had room: not a preemption; the next step says where to look


def test_only_the_last_run_of_a_restarted_server_is_judged(know, tmp_path):  # type: ignore[no-untyped-def]
    first = startup("vllm/healthy-v0-tp2-serving.log") + [vllm_v0_stats(i, 61, 98, 0.99) for i in range(14)]
    second = startup("vllm/healthy-v0-tp2-serving.log") + [vllm_v0_stats(i, 3, 0, 0.05) for i in range(6)]
    d = diagnose_lines(know, first + second, tmp_path)
    assert d.serving.verdict == "client_bound"
    assert d.serving.summary["kv_usage"]["max"] == 0.05


def test_judge_on_no_points_is_none():  # type: ignore[no-untyped-def]
    assert judge([], 0, None) is None


# --- outputs -----------------------------------------------------------------------------------


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diagnose", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
        timeout=60,
    )


def test_json_text_markdown_and_the_chart(tmp_path):  # type: ignore[no-untyped-def]
    log = tmp_path / "kv.log"
    log.write_text(
        "\n".join(
            startup("vllm/healthy-v0-tp2-serving.log")
            + [vllm_v0_stats(i, 60, 90 + i, 0.96) for i in range(14)]
        )
        + "\n"
    )
    j = json.loads(_cli("scan", "--json", str(log)).stdout)
    s = j["serving"]
    assert j["schema"] == 1 and s["verdict"] == "kv_bound" and s["stats_lines"] == 14
    assert set(s["series"][0]) >= {"line", "time", "running", "waiting", "kv_usage"}
    assert s["evidence"]["line"] > 0 and "GPU KV cache usage" in s["evidence"]["text"]
    plain = _cli("scan", str(log))
    assert plain.returncode == 1
    assert "serving   kv bound · 14 stats lines" in plain.stdout
    assert "KV cache ▇" not in plain.stdout and "KV cache █" not in plain.stdout  # no chart in a pipe
    charted = _cli("scan", "--chart", str(log)).stdout
    assert "KV cache " in charted and "max 96%" in charted and "queue" in charted
    md = _cli("scan", "--format", "markdown", str(log)).stdout
    assert "**Serving:** kv bound" in md


def test_a_log_without_stats_lines_has_serving_null(tmp_path):  # type: ignore[no-untyped-def]
    j = json.loads(_cli("scan", "--json", str(FIXTURES / "vllm" / "kv-cache-too-small-v1.log")).stdout)
    assert j["serving"] is None


def test_counts_after_token_are_not_redacted_but_tokens_are():  # type: ignore[no-untyped-def]
    from diagnose.base.redact import redact

    line = "[03:51:54] Decode batch, #running-req: 6, #full token: 2435072, full token usage: 0.92"
    assert redact(line) == line
    assert "hf_" not in redact("HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123")


# --- the real logs -------------------------------------------------------------------------------


def _real_with_stats() -> list[Path]:
    if not REAL.is_dir():
        return []
    out = []
    for d in sorted(REAL.iterdir()):
        log = d / "log.txt"
        if log.is_file():
            with open(log, "rb") as f:
                head = f.read()
            if any(n.encode() in head for n in STATS_NEEDLES):
                out.append(d)
    return out


@pytest.mark.skipif(not REAL.is_dir(), reason="../shared/real-logs is not here")
@pytest.mark.parametrize("case", _real_with_stats(), ids=lambda p: p.name)
def test_real_logs_with_stats_lines(know, case):  # type: ignore[no-untyped-def]
    import yaml

    from diagnose.pipeline.scan import scan_paths

    label = yaml.safe_load((case / "label.yaml").read_text())
    d = scan_paths([str(case / "log.txt")], know)
    assert d.serving is not None
    serving_findings = [f for f in d.findings if f.rule.startswith("serving.")]
    if label["class"] == "healthy":
        assert not serving_findings and d.status == "ready", d.serving.why
    if label["class"] == "preemption":
        assert d.primary is not None and d.primary.cls == "preemption"


def test_data_parallel_engines_are_judged_one_by_one(know, tmp_path):  # type: ignore[no-untyped-def]
    # vLLM V1 with --data-parallel-size 2: each engine prints its own line; engine 000 is full
    # and queueing, engine 001 idles. Mixed, only half the lines are full (below the 60 % bar).
    lines = startup("vllm/healthy-v1-serving.log")
    for i in range(12):
        lines.append(vllm_v1_stats(i, 64, 20 + i, 0.97))
        lines.append(vllm_v1_stats(i, 1, 0, 0.02).replace("Engine 000:", "Engine 001:"))
    d = diagnose_lines(know, lines, tmp_path)
    assert d.serving.verdict == "kv_bound"
    assert d.serving.why.startswith("engine 000: ")
    assert d.serving.summary["replicas"] == {"engine 000": "kv_bound", "engine 001": "client_bound"}
    assert d.status == "degraded"


def test_a_collapse_is_a_finding_only_under_a_full_cache(know, tmp_path):  # type: ignore[no-untyped-def]
    # a few full lines early on, the collapse itself with the cache at 60 %: told, not a finding
    lines = startup("sglang/healthy-tp2-serving.log") + [
        sglang_decode(i * 5, 16, 0, 0.95 if i < 2 else 0.6, 800.0 if i < 8 else 90.0) for i in range(14)
    ]
    d = diagnose_lines(know, lines, tmp_path)
    assert d.serving.verdict == "throughput_collapse" and d.serving.summary["kv_full_share"] > 0
    assert not d.serving.degraded and d.status == "ready" and d.serving.next_step
