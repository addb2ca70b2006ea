"""Reading and splitting real log lines (formats from the reference and real logs)."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import pytest

from diagnose.base.errors import InputError
from diagnose.knowledge.engine_profiles import load_profiles
from diagnose.model.records import Line
from diagnose.read.sources import CUT_MARKER, MAX_LINE, Source, decode, read_blocks, resolve_sources

from .conftest import FIXTURES, SHARED, profile_oom

LAYOUT = load_profiles().layout  # every shipped engine's line layouts


def make_line(source: str, number: int, raw: bytes) -> Line:
    """One line split as a fresh scan would (nothing learned from other lines)."""
    return LAYOUT.fresh().line(source, number, raw)


def iter_lines(source: Source) -> Iterator[Line]:
    return LAYOUT.fresh().lines(source)


# (raw line, message, level, timestamp, process, rank, pid, location)
CASES = [
    # kubectl logs --prefix
    (
        "[pod/vllm-7d9f8c-abcde/vllm] (APIServer pid=1) ERROR 09-03 11:03:37 [core.py:712] ValueError: x",
        "ValueError: x",
        "ERROR",
        "09-03 11:03:37",
        "APIServer",
        None,
        1,
        "core.py:712",
    ),
    # cat -n
    (
        "    12\tINFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.8.5",
        "vLLM API server version 0.8.5",
        "INFO",
        "05-01 10:00:00",
        None,
        None,
        None,
        "api_server.py:1",
    ),
    # journalctl -o short-iso: the host's time, the unit's process, then the engine's line
    (
        "2025-03-01T10:00:05+0000 gpu-01 python3[4242]: (EngineCore_DP0 pid=4250) ERROR 03-01 10:00:05 [core.py:1] boom",
        "boom",
        "ERROR",
        "2025-03-01T10:00:05+0000",
        "EngineCore_DP0",
        None,
        4250,
        "core.py:1",
    ),
    # a wrapper nobody documents in front of a layout we know (stern's "pod container ")
    (
        "vllm-0 vllm INFO 05-01 10:00:00 [loggers.py:1] Engine 000: Running: 1 reqs",
        "Engine 000: Running: 1 reqs",
        "INFO",
        "05-01 10:00:00",
        None,
        None,
        None,
        "loggers.py:1",
    ),
    # …but words before a level word are not a wrapper when no time or process follows
    (
        "Exception: ERROR while reading the config",
        "Exception: ERROR while reading the config",
        None,
        None,
        None,
        None,
        None,
        None,
    ),
    (
        "(EngineCore_0 pid=1810465) ERROR 09-03 11:03:37 [core.py:712] ValueError: Free memory",
        "ValueError: Free memory",
        "ERROR",
        "09-03 11:03:37",
        "EngineCore_0",
        None,
        1810465,
        "core.py:712",
    ),
    (
        "2025-05-16T13:08:58.459825551Z (VllmWorker rank=3 pid=252) DEBUG 05-16 13:08:58 [parallel_state.py:867] "
        "world_size=8 rank=3",
        "world_size=8 rank=3",
        "DEBUG",
        "2025-05-16T13:08:58.459825551Z",
        "VllmWorker rank=3",
        3,
        252,
        "parallel_state.py:867",
    ),
    (
        "(VllmWorker TP1 pid=2418) INFO 06-05 06:17:20 [pynccl.py:70] vLLM is using nccl==2.26.2",
        "vLLM is using nccl==2.26.2",
        "INFO",
        "06-05 06:17:20",
        "VllmWorker TP1",
        1,
        2418,
        "pynccl.py:70",
    ),
    (
        "(RayWorkerWrapper pid=5123, ip=10.0.0.2) INFO 06-05 06:17:20 worker.py:1] ok",
        "ok",
        "INFO",
        "06-05 06:17:20",
        "RayWorkerWrapper",
        None,
        5123,
        "worker.py:1",
    ),
    (
        "(Worker_TP0 pid=77) INFO 01-02 03:04:05 [gpu_worker.py:276] x",
        "x",
        "INFO",
        "01-02 03:04:05",
        "Worker_TP0",
        0,
        77,
        "gpu_worker.py:276",
    ),
    (
        "[2026-01-12 02:47:08 TP1] Capture cuda graph end.",
        "Capture cuda graph end.",
        None,
        "2026-01-12 02:47:08",
        "TP1",
        1,
        None,
        None,
    ),
    (
        "[2025-01-23 19:35:20 DP0 TP3] Load weight begin.",
        "Load weight begin.",
        None,
        "2025-01-23 19:35:20",
        "DP0 TP3",
        3,
        None,
        None,
    ),
    (
        "[2024-12-10 15:50:02] ERROR:    [Errno 98] error while attempting",
        "[Errno 98] error while attempting",
        "ERROR",
        "2024-12-10 15:50:02",
        None,
        None,
        None,
        None,
    ),
    (
        "vllm  | ERROR 02-11 08:25:49 serving_chat.py:661] torch.OutOfMemoryError: CUDA",
        "torch.OutOfMemoryError: CUDA",
        "ERROR",
        "02-11 08:25:49",
        None,
        None,
        None,
        "serving_chat.py:661",
    ),
    (
        ">   | [2024-09-05T00:38:34Z] INFO:     Application startup complete.",
        "Application startup complete.",
        "INFO",
        "2024-09-05T00:38:34Z",
        None,
        None,
        None,
        None,
    ),
    (
        "│ INFO 03-21 20:15:44 [monitor.py:33] torch.compile takes 28.77 s in total          │",
        "torch.compile takes 28.77 s in total",
        "INFO",
        "03-21 20:15:44",
        None,
        None,
        None,
        "monitor.py:33",
    ),
    (
        "2024-05-01T01:19:02.778572Z  INFO shard-manager: text_generation_launcher: Waiting for shard to be ready... rank=1",
        "Waiting for shard to be ready... rank=1",
        "INFO",
        "2024-05-01T01:19:02.778572Z",
        None,
        1,
        None,
        None,
    ),
    (
        '[rank0]:   File "x.py", line 31, in <module>',
        '  File "x.py", line 31, in <module>',
        None,
        None,
        None,
        0,
        None,
        None,
    ),
    (
        "2025-05-26 18:53:52,518\tINFO worker.py:1888 -- Started a local Ray instance.",
        "Started a local Ray instance.",
        "INFO",
        "2025-05-26 18:53:52,518",
        None,
        None,
        None,
        "worker.py:1888",
    ),
    (
        "INFO:     Application startup complete.",
        "Application startup complete.",
        "INFO",
        None,
        None,
        None,
        None,
        None,
    ),
    (
        "AssertionError: 16 is not divisible by 6",
        "AssertionError: 16 is not divisible by 6",
        None,
        None,
        None,
        None,
        None,
        None,
    ),
]


@pytest.mark.parametrize("raw,message,level,ts,process,rank,pid,loc", CASES)
def test_split_prefixes(raw, message, level, ts, process, rank, pid, loc):
    line = make_line("x.log", 7, raw.encode())
    assert (line.message, line.level, line.timestamp, line.process, line.rank, line.pid, line.location) == (
        message,
        level,
        ts,
        process,
        rank,
        pid,
        loc,
    )
    assert line.number == 7 and line.source == "x.log"


def test_ansi_crlf_and_carriage_returns():
    raw = b"\x1b[1;36m(APIServer pid=4394)\x1b[0;0m INFO:     Application startup complete.\r\n"
    line = make_line("x", 1, raw)
    assert line.text == "(APIServer pid=4394) INFO:     Application startup complete."
    assert line.message == "Application startup complete." and line.pid == 4394
    text, cut = decode(b"Loading shards:  50%\rLoading shards: 100%\r")
    assert text == "Loading shards: 100%" and not cut


def test_non_utf8_is_replaced_not_fatal():
    line = make_line("x", 1, b"ERROR caf\xe9 \xff\xfe broke")
    assert "\ufffd" in line.text


def _write(tmp_path, name, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return Source(str(p), str(p))


def test_blocks_keep_line_numbers_and_final_partial_line(tmp_path):
    src = _write(tmp_path, "a.log", b"one\r\ntwo\n\nfour")
    lines = list(iter_lines(src))
    assert [(x.number, x.text) for x in lines] == [(1, "one"), (2, "two"), (3, ""), (4, "four")]


def test_megabyte_line_keeps_its_head_and_tail(tmp_path, capsys):
    """An error at the end of a 3 MiB line is still read; stderr says a line was cut."""
    big = b"x" * (3 * MAX_LINE) + b" RuntimeError: CUDA error: out of memory\nafter\n"
    src = _write(tmp_path, "big.log", b"before\n" + big)
    lines = list(iter_lines(src))
    assert [x.number for x in lines] == [1, 2, 3]
    assert lines[1].truncated and len(lines[1].text) < MAX_LINE + 100
    assert CUT_MARKER.decode() in lines[1].text and lines[1].text.endswith("CUDA error: out of memory")
    assert lines[2].text == "after"
    assert "1 line(s) over 1 MiB were cut" in capsys.readouterr().err


def test_long_line_inside_one_block_is_cut(tmp_path):
    data = b"a\n" + b"y" * (MAX_LINE + 10) + b"\nb\n"
    blocks = list(read_blocks(_write(tmp_path, "m.log", data), block_size=4 * MAX_LINE))
    joined = b"".join(blocks)
    assert joined.count(b"\n") == 3 and CUT_MARKER in joined


def test_gzip_and_truncated_gzip(tmp_path, capsys):
    good = tmp_path / "s.log.gz"
    with gzip.open(good, "wb") as g:
        g.write(b"INFO:     Application startup complete.\n")
    assert [x.message for x in iter_lines(Source(str(good), str(good)))] == ["Application startup complete."]
    bad = _write(tmp_path, "t.log.gz", good.read_bytes()[:-12])
    # cut short: what decoded is read, and a notice says where it stopped
    assert [x.message[:20] for x in iter_lines(bad)] == ["Application startup "]
    assert "truncated or corrupt gzip data after" in capsys.readouterr().err
    nothing = _write(tmp_path, "n.log.gz", good.read_bytes()[:12])
    with pytest.raises(InputError, match="truncated or corrupt gzip"):
        list(read_blocks(nothing))


@pytest.mark.parametrize("data,msg", [(b"", "empty input"), (b"\x00\x01\x02ELF\x00binary", "binary data")])
def test_empty_and_binary_input(tmp_path, data, msg):
    with pytest.raises(InputError, match=msg):
        list(read_blocks(_write(tmp_path, "f.log", data)))


def test_resolve_sources_errors(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        resolve_sources([str(tmp_path / "missing.log")])
    with pytest.raises(InputError, match="is a directory"):
        resolve_sources([str(tmp_path)])
    assert resolve_sources([])[0].name == "-"


@pytest.mark.parametrize(
    ("raw", "message", "level", "ts"),
    [
        # Docker's json-file driver / Fluentd / Loki exports: the runtime's time, then the line
        (
            r'{"log":"\u001b[1;36m(APIServer pid=17544)\u001b[0;0m ERROR 09-29 00:29:32 [core.py:1] RuntimeError: CUDA error: out of memory\n","stream":"stderr","time":"2025-09-29T00:29:32.104857318Z"}',
            "RuntimeError: CUDA error: out of memory",
            "ERROR",
            "2025-09-29T00:29:32.104857318Z",
        ),
        # TGI --json-output (Rust tracing, flattened fields)
        (
            '{"timestamp":"2024-02-14T06:49:24.783316Z","level":"ERROR","message":"Shard 0 failed to start","target":"text_generation_launcher","filename":"launcher/src/main.rs","line_number":1},',
            None,
            None,
            None,
        ),
        (
            '{"timestamp":"2024-02-14T06:49:24.783316Z","level":"ERROR","message":"Shard 0 failed to start","target":"text_generation_launcher","spans":[{"name":"shard-manager","rank":0}]}',
            "Shard 0 failed to start",
            "ERROR",
            "2024-02-14T06:49:24.783316Z",
        ),
        # tracing's default JSON: the message inside "fields", other fields after it
        (
            '{"timestamp":"2024-02-14T06:49:27.099268Z","level":"INFO","fields":{"message":"Waiting for shard to be ready...","rank":0},"target":"text_generation_launcher"}',
            "Waiting for shard to be ready... rank=0",
            "INFO",
            "2024-02-14T06:49:27.099268Z",
        ),
        # a cloud logger's record and journalctl -o json
        (
            '{"textPayload":"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.","timestamp":"2025-03-01T10:00:00Z","severity":"ERROR"}',
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            "ERROR",
            "2025-03-01T10:00:00Z",
        ),
        (
            '{"MESSAGE":"INFO 03-01 10:00:00 [api_server.py:1] vLLM API server version 0.8.5","_PID":"4242","_COMM":"python3"}',
            "vLLM API server version 0.8.5",
            "INFO",
            "03-01 10:00:00",
        ),
    ],
)
def test_json_log_records_read_as_their_lines(raw, message, level, ts):  # type: ignore[no-untyped-def]
    line = make_line("x", 1, raw.encode())
    if message is None:  # not a JSON object (a trailing comma): the line as it is
        assert line.text == raw
        return
    assert line.message == message and line.level == level and line.timestamp == ts


def test_journalctl_json_keeps_its_time():  # type: ignore[no-untyped-def]
    raw = b'{"MESSAGE":"RuntimeError: CUDA error: out of memory","__REALTIME_TIMESTAMP":"1740823200123456","_PID":"4242"}'
    line = make_line("x", 1, raw)
    assert (
        line.timestamp == "2025-03-01T10:00:00.123456Z"
        and line.message == "RuntimeError: CUDA error: out of memory"
    )


def test_json_that_is_not_a_log_record_stays_as_it_is():  # type: ignore[no-untyped-def]
    for raw in (
        '{"function":"load_model","level":"ERR","line":410,"msg":"unable to load model"}',  # llama.cpp's own
        '{"model": "x", "max_tokens": 5}',  # a request body someone logged
        "{not json}",
    ):
        assert make_line("x", 1, raw.encode()).text == raw


@pytest.mark.skipif(not (SHARED / "real-logs").is_dir(), reason="../shared/real-logs is not here")
@pytest.mark.parametrize(
    "name",
    [
        "vllm-053-oom-runtime-v1-rtx3090-real-workload",
        "tgi-201-tp_mismatch-vocab-not-divisible-3-shards",
        "sglang-214-oom_load-mixtral-8x7b-single-gpu-tp-not-set",
        "ollama-205-driver-cuda-init-error-3-v100-cpu-fallback",
        "vllm-402-healthy-ctrlc-port-used-warning",
    ],
)
def test_a_real_log_from_dockers_json_file_reads_the_same(name, know, tmp_path):  # type: ignore[no-untyped-def]
    import json

    from diagnose.pipeline.scan import scan_paths

    src = SHARED / "real-logs" / name / "log.txt"
    lines = src.read_text(errors="replace").split("\n")
    wrapped = tmp_path / "container-json.log"
    wrapped.write_text(
        "\n".join(
            json.dumps(
                {
                    "log": x + "\n",
                    "stream": "stderr",
                    "time": f"2025-03-01T10:{i // 60 % 60:02d}:{i % 60:02d}.0Z",
                }
            )
            for i, x in enumerate(lines)
        )
    )
    a, b = scan_paths([str(src)], know), scan_paths([str(wrapped)], know)
    assert (b.status, b.primary and b.primary.cls, b.primary and b.primary.oom_phase) == (
        a.status,
        a.primary and a.primary.cls,
        a.primary and a.primary.oom_phase,
    )


def test_a_log_pasted_as_a_markdown_code_block_is_read_without_its_indent(know, tmp_path):  # type: ignore[no-untyped-def]
    from diagnose.match.scanner import paste_indent
    from diagnose.pipeline.scan import scan_paths

    log = "INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.8.5\n" + profile_oom()
    pasted = "".join("    " + x + "\n" for x in log.splitlines())
    (tmp_path / "a.log").write_text(log)
    (tmp_path / "b.log").write_text(pasted)
    a, b = scan_paths([str(tmp_path / "a.log")], know), scan_paths([str(tmp_path / "b.log")], know)
    assert a.primary.cls == b.primary.cls == "oom" and a.primary.oom_phase == b.primary.oom_phase == "startup"
    assert b.primary.evidence == a.primary.evidence
    assert paste_indent(pasted.encode()) == b"    "
    assert paste_indent(log.encode()) == b""  # a traceback's own two-space frames are not a paste


def test_utf16_and_byte_order_marks_are_read_as_text(know, tmp_path):  # type: ignore[no-untyped-def]
    """Windows PowerShell 5's `>` writes UTF-16 with a byte-order mark; editors add a UTF-8 one.
    Both read as the same log (not as binary data, not with a mark glued to the first line)."""
    from diagnose.pipeline.scan import scan_paths

    log = (
        "INFO 05-01 10:00:00 [api_server.py:1] vLLM API server version 0.8.5\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 23.65 GiB of which 1.00 GiB is free.\n"
    )
    want = None
    for enc in ("utf-8", "utf-16", "utf-16-be", "utf-8-sig"):
        f = tmp_path / f"{enc}.log"
        data = log.encode(enc)
        if enc == "utf-16-be":
            data = b"\xfe\xff" + data
        f.write_bytes(data)
        d = scan_paths([str(f)], know)
        got = (d.engine.version, d.primary.cls, d.primary.evidence)
        want = want or got
        assert got == want and got[0] == "0.8.5", enc


def test_a_stray_nul_byte_leaves_a_text_log_a_text_log(tmp_path):
    """A writer killed mid-line can leave a NUL in a log: the log is still read (an executable,
    with NULs everywhere, is still refused as binary)."""
    text = (FIXTURES / "logs" / "vllm" / "oom-runtime-v1-fragmented.log").read_bytes()
    p = tmp_path / "serve.log"
    p.write_bytes(text[:2000] + b"\x00" + text[2000:])
    lines = list(iter_lines(Source(str(p), str(p))))
    assert any("CUDA out of memory" in x.text for x in lines)
    exe = tmp_path / "a.out"
    exe.write_bytes(b"\x7fELF\x02\x01\x01" + b"\x00" * 9 + b"\x02\x00>\x00" * 500)
    with pytest.raises(InputError, match="binary data"):
        list(iter_lines(Source(str(exe), str(exe))))


def test_a_json_record_is_one_line_whatever_field_holds_a_newline():
    """Found by the property test: a record's time (or span, or level) holding a newline made
    the rebuilt line two."""
    from diagnose.read.sources import unwrap_json

    assert unwrap_json('{"log": null, "message": "", "time": "\\n"}') == " ⏎  "
    assert unwrap_json('{"log": "a\\nb\\n", "time": "2024-01-01T00:00:00Z"}') == "2024-01-01T00:00:00Z a ⏎ b"
