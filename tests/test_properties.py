"""Arbitrary input never makes a traceback: the line reader, the launch-dump reader, the
nvidia-smi reader and the config reader take at least 1,000 generated inputs each and either
read them or refuse them with an InputError (a one-line message), nothing else."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnose.errors import InputError

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
    from diagnose.lines import Source
    from diagnose.pipeline import scan_paths

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
        from diagnose.knowledge import Knowledge

        _KNOW = Knowledge.load()
    return _KNOW


@MANY
@given(
    st.sampled_from(["python_call", "python_dict", "python_kwargs", "rust_debug", "command_line"]),
    st.text(max_size=400),
)
def test_launch_dump_reader_never_raises(kind, text):
    from diagnose.launch import parse_repr

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
    from diagnose.device import parse_nvidia_smi

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
    from diagnose.budget import load_config, shape_from_config

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

    from diagnose.gguf import config_from_gguf

    data = b"GGUF" + struct.pack("<IQQ", version, 0, n_kv) + body
    with tempfile.NamedTemporaryFile(suffix=".gguf", delete=False) as f:
        f.write(data)
    try:
        with contextlib.suppress(InputError):
            config_from_gguf(f.name)
    finally:
        os.unlink(f.name)
