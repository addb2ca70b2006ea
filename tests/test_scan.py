"""Matcher and triage on small real-format logs: tracebacks, ranks, phases, consequences."""

from __future__ import annotations

from diagnose.pipeline.scan import scan_sources
from diagnose.pipeline.stages import diagnose
from diagnose.read.sources import Source

from .conftest import FIXTURES


def run(tmp_path, know, text: str, engine: str | None = None):
    p = tmp_path / "serve.log"
    p.write_text(text)
    res = scan_sources([Source("serve.log", str(p))], know, engine)
    return diagnose(res, know, "serve.log", engine)


V1_PREFIX = "(VllmWorker rank={r} pid=9{r}) ERROR 03-20 23:26:06 [multiproc_executor.py:375] "


def test_interleaved_rank_tracebacks_fold_into_one_event(tmp_path, know):
    lines = [
        "(VllmWorker rank=0 pid=90) INFO 03-20 23:25:00 [gpu_model_runner.py:1] Starting to load model m...",
        "(VllmWorker rank=0 pid=90) INFO 03-20 23:25:30 [gpu_model_runner.py:2] Model loading took 40.1 GiB and 30.1 seconds",
        "(VllmWorker rank=0 pid=90) INFO 03-20 23:25:59 [gpu_worker.py:276] Available KV cache memory: 20.11 GiB",
    ]
    for r in (0, 1):
        lines.append(V1_PREFIX.format(r=r) + "Traceback (most recent call last):")
    for r in (0, 1):
        lines.append(
            V1_PREFIX.format(r=r)
            + '  File "/x/vllm/v1/worker/gpu_model_runner.py", line 2690, in capture_model'
        )
    for r in (1, 0):
        lines.append(V1_PREFIX.format(r=r) + "    self._capture_cudagraphs(")
    for r in (0, 1):
        lines.append(
            V1_PREFIX.format(r=r)
            + f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU {r} has a total capacity of 79.19 GiB of which 9.06 MiB is free."
        )
    d = run(tmp_path, know, "\n".join(lines) + "\n")
    assert d.status == "failed"
    p = d.primary
    assert p.cls == "oom" and p.oom_phase == "startup" and p.ranks == [0, 1]
    assert p.evidence.startswith("torch.OutOfMemoryError") and p.facts["free_gib"] == round(9.06 / 1024, 4)
    assert [f.cls for f in d.findings] == ["oom"]


def test_unexplained_traceback_is_unknown_error_with_exception_line(tmp_path, know):
    d = run(
        tmp_path,
        know,
        "INFO 01-01 00:00:00 [x.py:1] Starting to load model m...\n"
        'Traceback (most recent call last):\n  File "/srv/app.py", line 3, in main\n    frob()\n'
        "ZeroDivisionError: division by zero\n",
    )
    assert d.status == "failed" and d.primary.cls == "unknown_error"
    assert d.primary.evidence == "ZeroDivisionError: division by zero" and d.primary.line == 5


def test_recovered_exception_before_ready_is_not_fatal(tmp_path, know):
    d = run(
        tmp_path,
        know,
        'Traceback (most recent call last):\n  File "/srv/app.py", line 3, in warm\n    x()\n'
        "KeyError: 'optional_feature'\nINFO:     Application startup complete.\n"
        'INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 200 OK\n',
    )
    assert d.status == "ready" and d.primary.severity == "warning"  # noted, not degrading


def test_nccl_error_after_an_oom_is_a_consequence(tmp_path, know):
    d = run(
        tmp_path,
        know,
        "(VllmWorker rank=0 pid=1) ERROR 01-01 00:00:01 [x.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.00 GiB is free.\n"
        "(VllmWorker rank=1 pid=2) ERROR 01-01 00:00:02 [x.py:1] RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)\n",
    )
    assert d.primary.cls == "oom"
    nccl = next(f for f in d.findings if f.cls == "nccl")
    assert nccl.consequence


def test_oom_phase_from_timeline_not_wording(tmp_path, know):
    # the OOM message says "warming up" but the server had served requests: runtime
    d = run(
        tmp_path,
        know,
        "INFO:     Application startup complete.\n"
        "INFO 01-01 00:00:10 metrics.py:1] Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 1.0%, CPU KV cache usage: 0.0%.\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.69 GiB of which 1.00 GiB is free.\n",
    )
    assert d.primary.oom_phase == "runtime" and d.primary.phase_inferred is None


def test_oom_phase_inferred_from_stack_without_timeline(tmp_path, know):
    d = run(
        tmp_path,
        know,
        "Traceback (most recent call last):\n"
        '  File "/x/vllm/worker/model_runner.py", line 1, in load_model\n    self.model = get_model()\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.69 GiB of which 1.00 GiB is free.\n",
    )
    assert d.primary.oom_phase == "load" and d.primary.phase_inferred == "stack"


def test_healthy_lines_that_look_scary_are_not_failures(tmp_path, know):
    d = run(
        tmp_path,
        know,
        "\n".join(
            [
                "INFO 05-26 18:53:37 [api_server.py:1044] args: Namespace(enforce_eager=False, disable_log_requests=False, max_model_len=None)",
                "WARNING 05-26 18:53:44 [config.py:1443] Possibly too large swap space. 16.00 GiB out of the 23.34 GiB total CPU memory is allocated for the swap space.",
                "INFO 12-01 10:00:00 model_runner.py:1072] Capturing cudagraphs for decoding. If out-of-memory error occurs during cudagraph capture, consider decreasing `gpu_memory_utilization` or switching to eager mode. You can also reduce the `max_num_seqs` as needed to decrease memory usage.",
                "INFO 12-01 10:00:20 model_runner.py:1530] Graph capturing finished in 18 secs, took 0.84 GiB",
                "INFO:     Application startup complete.",
            ]
        )
        + "\n",
    )
    assert d.status == "ready" and d.primary is None and d.advice == []


def test_forced_engine_and_detection_reason(tmp_path, know):
    text = "[2025-06-17 03:52:36] The server is fired up and ready to roll!\n"
    d = run(tmp_path, know, text)
    assert d.engine.name == "sglang" and "fired up" in d.engine.reason
    d2 = run(tmp_path, know, text, engine="vllm")
    assert d2.engine.name == "vllm" and d2.engine.reason == "forced with --engine"


def test_server_restart_keeps_only_the_last_run_fatal(tmp_path, know):
    run1 = (
        "INFO 01-01 00:00:00 api_server.py:1] vLLM API server version 0.6.6\n"
        "INFO 01-01 00:00:01 model_runner.py:1] Starting to load model m...\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.69 GiB of which 1.00 GiB is free.\n"
    )
    run2 = (
        "INFO 01-01 00:05:00 api_server.py:1] vLLM API server version 0.6.6\n"
        "INFO 01-01 00:05:01 model_runner.py:1] Starting to load model m...\n"
        "INFO 01-01 00:05:30 model_runner.py:2] Loading model weights took 7.1 GB\n"
        "INFO:     Application startup complete.\n"
    )
    d = run(tmp_path, know, run1 + run2)
    assert d.status == "degraded" and d.primary.severity == "warning" and "earlier run" in d.primary.note


def test_a_restart_after_a_long_serving_run_sees_the_new_runs_phases(tmp_path, know):
    """Markers retired in the first run (and dropped from the needle index after thousands of
    request lines) are searched again from the restart on."""
    log = (FIXTURES / "logs/vllm/restart-after-oom.log").read_text().splitlines(keepends=True)
    healthy, crashing = log[25:], log[:24]  # the fixture's second (healthy) run, then its first
    requests = [
        f'INFO:     10.0.3.17:{41000 + i % 9000} - "POST /v1/completions HTTP/1.1" 200 OK\n'
        for i in range(4000)
    ]
    d = run(tmp_path, know, "".join(healthy + requests + crashing))
    assert d.status == "failed" and d.primary.cls == "oom"
    assert d.primary.oom_phase == "startup" and d.primary.phase_inferred is None
    phases = [m.phase for m in d.timeline]
    assert "load_weights" in phases and "kv_cache" in phases


def test_a_restart_loop_costs_no_index_build_per_restart(know, tmp_path):
    """Thousands of restarts revive the same markers each time: the index built for that set is
    reused, and the rest of a block is searched a window at a time (#26: linear in bytes)."""
    from diagnose.match.scanner import Scanner
    from diagnose.read.sources import read_blocks

    run = (
        "INFO 05-26 18:53:37 [api_server.py:1043] vLLM API server version 0.8.5.post1\n"
        "INFO 05-26 18:53:40 [parallel_state.py:1004] rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, TP rank 0\n"
        "INFO 05-26 18:53:41 [gpu_model_runner.py:1329] Starting to load model x...\n"
        "INFO 05-26 18:53:50 [gpu_model_runner.py:1347] Model loading took 14.99 GiB and 8.1 seconds\n"
        "INFO 05-26 18:54:00 [api_server.py:1090] Starting vLLM API server on http://0.0.0.0:8000\n"
    )
    log = tmp_path / "loop.log"
    log.write_text(run * 600)
    scanner = Scanner(know.rules, know.profiles)
    for block in read_blocks(Source(str(log), str(log))):
        scanner.feed(block)
    result = scanner.finish()
    assert result.earlier_runs == 599
    assert scanner.candidates.builds < 20, scanner.candidates.builds


def test_a_traceback_whose_exception_line_never_comes_ends_before_later_errors(tmp_path, know):
    """A traceback cut short (its exception line lost, or in a format no pattern reads) is closed
    TRACEBACK_STALE lines after its last frame: an OOM 200 lines later is its own event, not
    an explanation of that traceback, and takes none of its frames."""
    lines = [
        "INFO 01-01 00:00:00 [x.py:1] Starting to load model m...",
        "Traceback (most recent call last):",
        '  File "/srv/vllm/model_executor/model_loader/loader.py", line 3, in load_model',
        "    frob()",
    ]
    lines += [f"INFO 01-01 00:00:{i % 60:02d} [x.py:2] step {i}" for i in range(200)]
    lines.append(
        "ERROR 01-01 00:05:00 [x.py:3] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "20.00 MiB. GPU 0 has a total capacity of 79.19 GiB of which 9.06 MiB is free."
    )
    d = run(tmp_path, know, "\n".join(lines) + "\n")
    by_title = {f.title: f for f in d.findings}
    assert "A traceback cut before its exception line" in by_title
    oom = next(f for f in d.findings if f.cls == "oom")
    assert oom.line == len(lines) and "load_model" not in oom.frames


def test_lines_only_broad_class_words_woke_are_not_even_split(know):
    """'checkpoint' wakes the weights vocabulary; a progress line holding none of the literals
    its patterns need is dropped before the prefix layers are tried (an ASCII one undecoded)."""
    from diagnose.match.scanner import Scanner

    sc = Scanner(know.rules, know.profiles)
    sc.set_source("serve.log")
    line = b"INFO 01-01 00:00:00 [weight_utils.py:1] Loading safetensors checkpoint shards: 50% Completed | 2/4\n"
    before = sc.layout._splits[0]
    sc.feed(line * 2000)
    assert sc.lineno == 2000
    assert sc.layout._splits[0] - before < 20
    sc.feed(b"ERROR 01-01 00:00:01 [x.py:1] the checkpoint is corrupt: header too short\n")
    assert sc.layout._splits[0] - before < 21  # a line its literals could match is read as before
    res = sc.finish()
    assert any(v.term for r in res.hits for v in r.vocab) or sc.words.recent


def test_a_plain_ascii_line_is_judged_on_its_bytes_as_on_its_text(know):  # type: ignore[no-untyped-def]
    """says_nothing_ascii (no decoding) answers as says_nothing does on the decoded text, for
    every line of the fixture logs that decodes to itself, with each vocabulary's needles and
    every pair of them as the needles found."""
    from diagnose.match.candidates import plain_ascii, says_nothing, says_nothing_ascii
    from diagnose.read.sources import decode

    vocab = [r for r in know.rules.rules if r.layer == "vocabulary"]
    sets = [[r] for r in vocab] + [[a, b] for a in vocab for b in vocab if a.id < b.id]
    checked = dropped = 0
    for p in sorted((FIXTURES / "logs").glob("*/*.log")):
        for raw in p.read_bytes().split(b"\n"):
            if not plain_ascii(raw):
                continue
            assert decode(raw)[0] == raw.decode()
            for handlers in sets:
                found = {n for h in handlers for n in h.needles[:1]}
                got = says_nothing_ascii(found, handlers, raw)
                assert got == says_nothing(found, handlers, raw.decode()), (
                    raw[:120],
                    [h.id for h in handlers],
                )
                checked += 1
                dropped += got
    assert checked > 50_000 and 0 < dropped < checked


def test_a_coloured_python_3_13_traceback_is_one_traceback_to_its_exception_line(tmp_path, know):
    """CPython ≥ 3.13 colours a frame's file name (`File \\x1b[35m"…"`): the frames are found
    though `File "` is not in the bytes, so a long traceback whose lines carry no other needle
    is read to its exception line, not closed as cut short (real lines of vLLM 0.21 on 3.14)."""
    p = "(APIServer pid=8410) "
    frame = (
        p
        + '  File \x1b[35m"/venv/lib/python3.14/site-packages/httpx/_client.py"\x1b[0m, line \x1b[35m{n}\x1b[0m, in \x1b[35msend\x1b[0m'
    )
    lines = [
        p
        + "INFO 05-25 10:54:26 [utils.py:240] non-default args: {'host': '0.0.0.0', 'model': 'Qwen/Qwen2.5-0.5B-Instruct'}",
        p + "INFO 05-25 10:54:28 [model.py:1697] Using max model len 512",
        p + "Traceback (most recent call last):",
    ]
    for n in range(40):  # 200 lines of frames and their code: longer than TRACEBACK_STALE
        lines += [frame.format(n=n), p + "    response = self._send_handling_auth(", p + "        request,"]
        lines += [p + "    ...<2 lines>...", p + "    )"]
    lines += [
        p + '    raise KeyboardInterrupt("terminated")',
        p + "\x1b[1;35mKeyboardInterrupt\x1b[0m: \x1b[35mterminated\x1b[0m",
    ]
    d = run(tmp_path, know, "\n".join(lines) + "\n")
    assert "A traceback cut before its exception line" not in {f.title for f in d.findings}
    assert d.status != "failed"  # a Ctrl-C that ended a wait, not a failure


def test_a_retired_needle_is_skipped_in_the_rest_of_its_block(know):
    """Once the engine is decided, its detection needle ("APIServer pid=", on every vLLM V1
    line) leads nowhere: its matches in the same block are skipped, not taken as candidate
    lines, and no window of the block is searched again."""
    from diagnose.match.scanner import Scanner

    sc = Scanner(know.rules, know.profiles)
    sc.set_source("serve.log")
    head = (FIXTURES / "logs/vllm/healthy-v1-serving.log").read_bytes()
    requests = b"".join(
        b'(APIServer pid=2107) INFO:     10.0.1.%d:56516 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
        % (i % 250)
        for i in range(2000)
    )
    taken = []
    real_take = sc._take_line
    sc._take_line = lambda block, pos, start, end, found: (
        taken.append(found) or real_take(block, pos, start, end, found)
    )
    sc.feed(head + requests)
    c = sc.candidates
    assert not c.live("APIServer pid=")
    assert len(taken) < head.count(b"\n") + 5, len(taken)  # the requests were not candidates
    assert c.skipped >= 2000 and c.builds <= 2


def test_an_engine_decision_retires_the_same_markers_as_one_at_a_time(know):
    """The markers a decided engine no longer needs are retired as one precomputed group: the
    same retired set and the same live needles as retiring them one by one, also when some of
    them were retired before (a phase already reached)."""
    from diagnose.match.scanner import Scanner

    def decide(grouped: bool, first_retired: int):
        sc = Scanner(know.rules, know.profiles)
        c = sc.candidates
        c.build()
        for m in c.markers[:first_retired]:
            c.retire(m)
        pick = lambda m: m.what == "detect" or m.engine not in ("vllm", "generic")  # noqa: E731
        if grouped:
            c.retire_markers(("test-decided", first_retired), pick)
        else:
            for m in c.markers:
                if pick(m):
                    c.retire(m)
        dead = {c.needles[i] for i in c.dead_now()}
        return c.retired, {n for n in c.by_needle if c.live(n)}, dead

    for first in (0, 40):
        assert decide(True, first) == decide(False, first)
