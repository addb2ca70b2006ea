"""Arbitrary input never makes a traceback: every reader (the line reader and scan, launch
dumps, nvidia-smi, config.json, GGUF headers, --gpus, --budget, engines' stats lines, JSON log
records, /metrics, incident files) takes at least 1,000 generated inputs and either reads them
or refuses them with a one-line message, nothing else."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnose.base.errors import InputError

MANY = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# bytes that look like logs more often than pure noise does: prefixes, escapes, long runs
LOGGISH = st.one_of(
    st.binary(max_size=2048),
    st.lists(
        st.sampled_from(
            [
                b"INFO 05-26 18:53:37 [api_server.py:1043] ",
                b"(EngineCore pid=1) ",
                b"[2025-01-23 19:35:20 TP0] ",
                b"time=2025-02-03T10:11:12Z level=ERROR source=x.go:1 msg=",
                b"[TRT-LLM] [E] ",
                b"[TM][ERROR] ",
                b"Traceback (most recent call last):\n",
                b'  File "/x.py", line 1, in f\n',
                b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
                b"\x1b[31m",
                b"\r",
                b"\n",
                b"\xff\xfe",
                b"\x00",
                b"x" * 300,
            ]
        ),
        max_size=40,
    ).map(b"".join),
)


@MANY
@given(LOGGISH)
def test_line_reader_and_scan_never_raise_anything_else(data):
    from diagnose.pipeline.scan import scan_paths
    from diagnose.read.sources import Source

    with tempfile.NamedTemporaryFile(suffix=".log", delete=False) as f:
        f.write(data)
    try:
        try:
            for _line in _know().profiles.layout.fresh().lines(Source(f.name, f.name)):
                pass
            scan_paths([f.name], _know())
        except InputError:
            pass  # empty or binary: a clear refusal
    finally:
        os.unlink(f.name)


_KNOW = None


def _know():  # type: ignore[no-untyped-def]
    global _KNOW
    if _KNOW is None:
        from diagnose.knowledge.loaded import Knowledge

        _KNOW = Knowledge.load()
    return _KNOW


@MANY
@given(
    st.sampled_from(["python_call", "python_dict", "python_kwargs", "rust_debug", "command_line"]),
    st.text(max_size=400),
)
def test_launch_dump_reader_never_raises(kind, text):
    from diagnose.read.launch_args import parse_repr

    assert isinstance(parse_repr(kind, text), dict)


SMI_PIECES = [
    "index, name, memory.total [MiB], memory.used [MiB]\n",
    "0, NVIDIA H100 80GB HBM3, 81559 MiB, 1 MiB\n",
    "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4 |\n",
    "|   0  NVIDIA A100-SXM4-80GB  On | 00000000:07:00.0 Off |  0 |\n",
    "| N/A   33C    P0  61W / 400W |  4MiB / 81920MiB |  0%  Default |\n",
    "==============NVSMI LOG==============\n",
    "    FB Memory Usage\n        Total : 81920 MiB\n",
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
    "abc",
    "\n",
    "|",
    "-1",
    "²",  # digits str.isdigit takes and int() may refuse
    "٣",
    "０",
]


@MANY
@given(st.one_of(st.text(max_size=800), st.lists(st.sampled_from(SMI_PIECES), max_size=30).map("".join)))
def test_nvidia_smi_reader_reads_or_refuses(text):
    from diagnose.host.nvidia_smi import parse_nvidia_smi

    try:
        snap = parse_nvidia_smi(text)
    except InputError:
        return
    assert snap.count >= 0


CONFIG_KEYS = [
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "torch_dtype",
    "architectures",
    "quantization_config",
    "n_routed_experts",
    "num_experts",
    "head_dim",
    "kv_lora_rank",
    "text_config",
]
VALUES = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=20)
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(CONFIG_KEYS), inner, max_size=6)
    ),
    max_leaves=20,
)


@MANY
@given(
    st.one_of(
        st.dictionaries(st.sampled_from(CONFIG_KEYS), VALUES, max_size=12), VALUES, st.text(max_size=200)
    )
)
def test_config_reader_reads_or_refuses(doc):
    from diagnose.budget.architecture import shape_from_config
    from diagnose.budget.config import load_config

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc, allow_nan=True))
    try:
        with contextlib.suppress(InputError):  # refused with a one-line message is fine
            shape_from_config(load_config(f.name))
    finally:
        os.unlink(f.name)


def _gguf_kv(key: str, vtype: int, payload: bytes) -> bytes:
    import struct

    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", vtype) + payload


# header pieces of the GGUF format: real keys with values of any type, counts, bytes
GGUF_PIECES = st.lists(
    st.one_of(
        st.builds(
            _gguf_kv,
            st.sampled_from(
                [
                    "general.architecture",
                    "general.alignment",
                    "llama.block_count",
                    "llama.embedding_length",
                    "llama.attention.head_count",
                    "llama.attention.head_count_kv",
                    "llama.context_length",
                    "general.file_type",
                ]
            ),
            st.integers(0, 13),
            st.binary(max_size=24),
        ),
        st.binary(max_size=16),
    ),
    max_size=12,
).map(b"".join)


@MANY
@given(st.integers(0, 4), st.integers(0, 9), GGUF_PIECES)
def test_gguf_reader_reads_or_refuses(version, n_kv, body):
    import struct

    from diagnose.budget.gguf import config_from_gguf

    data = b"GGUF" + struct.pack("<IQQ", version, 0, n_kv) + body
    with tempfile.NamedTemporaryFile(suffix=".gguf", delete=False) as f:
        f.write(data)
    try:
        with contextlib.suppress(InputError):
            config_from_gguf(f.name)
    finally:
        os.unlink(f.name)


# --- the small readers: options, stats lines, JSON log records, /metrics, incident files ---------


@MANY
@given(
    st.one_of(
        st.text(max_size=30),
        st.tuples(
            st.sampled_from(["", " ", "-", "+", "0", "1", "2", "8", "4097", "1e400", "nan"]),
            st.sampled_from(["x", "X", "×", "*", ""]),
            st.sampled_from(["80", "0", "-80", "80.5", "1e400", "inf", "nan", "80GiB", "80 GB", "", "4097"]),
        ).map("".join),
    )
)
def test_gpus_spec_reads_or_refuses(spec):
    from diagnose.budget.config import parse_gpus_spec

    try:
        got = parse_gpus_spec(spec)
    except InputError as e:
        assert "\n" not in str(e) and "--gpus" in str(e)
        return
    if got is not None:
        n, gib = got
        assert 1 <= n <= 4096 and 0 < gib <= 4096


@MANY
@given(
    st.lists(
        st.one_of(
            st.text(max_size=20),
            st.tuples(
                st.sampled_from(["load_weights", "kv_cache", "ready", "bogus", "load-weights", ""]),
                st.sampled_from(["=", ""]),
                st.sampled_from(["60", "0", "-1", "nan", "inf", "1e400", "x", "1.5", ""]),
            ).map("".join),
        ),
        max_size=4,
    )
)
def test_budgets_read_or_refuse(items):
    import math

    from diagnose.live.session import parse_budgets

    try:
        got = parse_budgets(items)
    except ValueError as e:
        assert "\n" not in str(e)
        return
    assert all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in got.values())


STATS_PIECES = [
    "Avg prompt throughput: ",
    "Avg generation throughput: ",
    "GPU KV cache usage: ",
    "Running: ",
    "Waiting: ",
    " reqs, ",
    " tokens/s, ",
    "%, ",
    "#running-req: ",
    "#token: ",
    "token usage: ",
    "gen throughput (token/s): ",
    "Decode batch. ",
    "1",
    "12.5",
    "1,234.5",
    "nan",
    "1e400",
    "-3",
    "…",
]


@MANY
@given(st.lists(st.sampled_from(STATS_PIECES), max_size=20).map("".join))
def test_stats_line_readers_read_numbers_or_nothing(text):
    for marker in _know().profiles.series:
        got = marker.read(text)
        assert all(isinstance(v, float) for v in got.values()), (marker.engine, text)


_KNOW: list[object] = []


def _know():  # type: ignore[no-untyped-def]
    if not _KNOW:
        from diagnose.knowledge.loaded import Knowledge

        _KNOW.append(Knowledge.load())
    return _KNOW[0]


JSON_LINE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.sampled_from(["log", "message", "msg", "MESSAGE", "time", "level", "fields", "spans", "x"]),
            children,
            max_size=5,
        ),
    ),
    max_leaves=12,
)


@MANY
@given(st.one_of(JSON_LINE.map(json.dumps), st.text(max_size=200).map(lambda t: "{" + t + "}")))
def test_json_log_records_unwrap_to_a_line_or_nothing(text):
    from diagnose.read.sources import unwrap_json

    got = unwrap_json(text)
    assert got is None or (isinstance(got, str) and "\n" not in got)


METRIC_PIECES = [
    "# HELP vllm:gpu_cache_usage_perc x\n",
    "# TYPE vllm:gpu_cache_usage_perc gauge\n",
    'vllm:gpu_cache_usage_perc{model_name="m"} ',
    "vllm:num_requests_running ",
    "vllm:num_requests_waiting ",
    "sglang:token_usage ",
    "0.5",
    "NaN",
    "+Inf",
    "1e400",
    "x",
    " 1700000000000",
    "\n",
    "{",
    '"',
]


@MANY
@given(st.one_of(st.text(max_size=300), st.lists(st.sampled_from(METRIC_PIECES), max_size=30).map("".join)))
def test_metrics_reader_reads_numbers_or_nothing(text):
    from diagnose.probe.sweep import read_metrics

    got = read_metrics(text, _know().profiles.metrics)
    assert all(isinstance(v, float) for v in got.values())


INCIDENT_PIECES = [
    "id: x\n",
    "id: 3\n",
    "title: t\n",
    "date: 2026-01-01\n",
    "root_cause: r\n",
    "fix: [a]\n",
    "fix: 3\n",
    "symptom:\n  classes: [oom]\n",
    "symptom: 7\n",
    "fingerprint: {classes: [oom], templates: [x]}\n",
    "fingerprint: [1]\n",
    ": :\n",
    "- - -\n",
    "\t",
    "&a [*a]\n",
]


@MANY
@given(st.one_of(st.text(max_size=200), st.lists(st.sampled_from(INCIDENT_PIECES), max_size=10).map("".join)))
def test_incident_file_reads_or_is_named_as_broken(text):
    from diagnose.base.validated_cache import DataCache
    from diagnose.store.incidents import _read_incident

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "i.yaml")
        with open(p, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            data = _read_incident(p, DataCache(os.path.join(d, "cache")))
        except InputError as e:
            assert p in str(e) and "\n" not in str(e).strip()
            return
        assert isinstance(data, dict) and "id" in data
