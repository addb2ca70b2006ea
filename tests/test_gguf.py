"""GGUF files (what Ollama and llama.cpp load) as model configs for `plan`.

The files are written here in GGUF v3 as llama.cpp writes them (magic, version, counts,
typed key/values with the token list as a string array, tensor infos, aligned data); the
tensor data is a sparse hole, so a 4.6 GiB model costs no disk. Tensor sizes follow ggml's
block sizes for a Q4_K_M Llama 3.1 8B (Q4_K: 144 bytes per 256 weights, Q6_K: 210).
"""

from __future__ import annotations

import json
import struct
import sys

import pytest

from diagnose.budget.architecture import shape_from_config
from diagnose.budget.config import load_config
from diagnose.budget.gguf import GGUFError, read_gguf
from diagnose.budget.kv import kv_bytes_per_token
from diagnose.budget.search import plan
from diagnose.budget.units import GIB, engine_units

from .conftest import run

DIAGNOSE = [sys.executable, "-m", "diagnose"]
Q4_K, Q6_K, F32 = 12, 14, 0


def _s(x: str) -> bytes:
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, value: object) -> bytes:
    out = _s(key)
    if isinstance(value, str):
        return out + struct.pack("<I", 8) + _s(value)
    if isinstance(value, list):  # a string array: the token list
        return out + struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_s(v) for v in value)
    if isinstance(value, float):
        return out + struct.pack("<If", 6, value)
    return out + struct.pack("<II", 4, int(value))  # uint32


def write_gguf(path, meta: dict, tensors: list[tuple[str, list[int], int, int]]) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """GGUF v3; tensors: (name, shape, ggml type, bytes). Returns (file size, tensor bytes)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    head += b"".join(_kv(k, v) for k, v in meta.items())
    offset = 0
    infos = b""
    for name, dims, gtype, nbytes in tensors:
        infos += _s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        infos += struct.pack("<IQ", gtype, offset)
        offset += -(-nbytes // 32) * 32
    header = head + infos
    start = -(-len(header) // 32) * 32
    with open(path, "wb") as f:
        f.write(header + b"\0" * (start - len(header)))
        f.truncate(start + offset)  # the tensors: a sparse hole
    return start + offset, offset


def _q(n: int, per256: int) -> int:
    return n // 256 * per256


def llama31_8b_q4km(path, vocab: int = 128256) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    h, i, kv, L = 4096, 14336, 1024, 32
    meta = {
        "general.architecture": "llama",
        "general.name": "Meta Llama 3.1 8B Instruct",
        "general.file_type": 15,  # MOSTLY_Q4_K_M
        "llama.block_count": L,
        "llama.context_length": 131072,
        "llama.embedding_length": h,
        "llama.feed_forward_length": i,
        "llama.attention.head_count": 32,
        "llama.attention.head_count_kv": 8,
        "llama.rope.freq_base": 500000.0,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": [f"t{n}" for n in range(vocab)],
    }
    tensors = [("token_embd.weight", [h, vocab], Q4_K, _q(h * vocab, 144))]
    for n in range(L):
        b = f"blk.{n}."
        tensors += [
            (b + "attn_norm.weight", [h], F32, 4 * h),
            (b + "attn_q.weight", [h, h], Q4_K, _q(h * h, 144)),
            (b + "attn_k.weight", [h, kv], Q4_K, _q(h * kv, 144)),
            (b + "attn_v.weight", [h, kv], Q6_K, _q(h * kv, 210)),
            (b + "attn_output.weight", [h, h], Q4_K, _q(h * h, 144)),
            (b + "ffn_norm.weight", [h], F32, 4 * h),
            (b + "ffn_gate.weight", [h, i], Q4_K, _q(h * i, 144)),
            (b + "ffn_up.weight", [h, i], Q4_K, _q(h * i, 144)),
            (b + "ffn_down.weight", [i, h], Q6_K, _q(h * i, 210)),
        ]
    tensors += [
        ("output_norm.weight", [h], F32, 4 * h),
        ("output.weight", [h, vocab], Q6_K, _q(h * vocab, 210)),
    ]
    return write_gguf(path, meta, tensors)


def test_a_gguf_header_reads_as_a_config_with_its_exact_bytes(tmp_path):  # type: ignore[no-untyped-def]
    f = tmp_path / "llama3.1-8b-q4_k_m.gguf"
    size, data = llama31_8b_q4km(f)
    cfg = load_config(str(f))
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == ("llama", 32, 8)
    assert cfg["vocab_size"] == 128256 and cfg["tie_word_embeddings"] is False
    s = shape_from_config(cfg)
    assert s.quant == "q4_k_m" and s.exact_bytes is not None
    assert s.exact_bytes == data and size - data < 4 * 1024 * 1024  # the header: the token list
    assert 4.5 < s.exact_bytes / GIB < 5.0
    assert kv_bytes_per_token(s) == 2 * 32 * 8 * 128 * 2  # the same KV as the HF config
    g = s.gguf
    assert len(g["layer_bytes"]) == 32 and g["output_bytes"] == _q(4096 * 128256, 210)


def test_plan_for_llama_server_from_the_gguf_alone(tmp_path):  # type: ignore[no-untyped-def]
    """No config.json: the file tells the layers, their bytes and the KV shape. On an 8 GiB card
    with 8,192 tokens of context, all 33 layers fit; at 131,072 tokens only some do."""
    f = tmp_path / "m.gguf"
    llama31_8b_q4km(f)
    s = shape_from_config(load_config(str(f)))
    units = engine_units("llamacpp")
    p = plan(s, 1, 8.0, max_model_len=8192, units=units)
    assert p.fits and p.gpu_layers == 33
    assert any("m.gguf's tensors" in a for a in p.assumptions)
    big = plan(s, 1, 8.0, max_model_len=131072, units=units)
    assert not big.fits and 0 < big.gpu_layers < 33
    r = run([*DIAGNOSE, "plan", "--json", "--config", str(f), "--gpus", "1x8", "--engine", "ollama"])
    doc = json.loads(r.stdout)
    assert doc["gpu_layers"] == 33 and doc["weights_from"] == "m.gguf's tensors"


def test_a_header_with_impossible_numbers_is_one_line(tmp_path):  # type: ignore[no-untyped-def]
    f = tmp_path / "huge.gguf"
    meta = {"general.architecture": "llama", "llama.block_count": 4_000_000_000}
    write_gguf(f, {**meta, "llama.embedding_length": 4096, "llama.attention.head_count": 32}, [])
    r = run([*DIAGNOSE, "plan", "--config", str(f)], text=True)
    assert r.returncode == 2 and "out of range" in r.stderr and "MemoryError" not in r.stderr


@pytest.mark.parametrize(
    ("data", "msg"),
    [
        (b"GGML" + b"\0" * 40, "not a GGUF file"),
        (b"GGUF" + struct.pack("<I", 1) + b"\0" * 40, "only versions 2 and 3"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 40), "header string"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1), "ends early"),
    ],
)
def test_a_broken_gguf_is_one_line(tmp_path, data, msg):  # type: ignore[no-untyped-def]
    f = tmp_path / "bad.gguf"
    f.write_bytes(data)
    with pytest.raises(GGUFError, match=msg):
        read_gguf(str(f))
    r = run([*DIAGNOSE, "plan", "--config", str(f)], text=True)
    assert r.returncode == 2 and msg.split()[0] in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("align", ["32", 0, 48])
def test_an_alignment_that_is_no_power_of_two_is_named(tmp_path, align):  # type: ignore[no-untyped-def]
    f = tmp_path / "odd.gguf"
    meta = {"general.architecture": "llama", "general.alignment": align, "llama.block_count": 2}
    write_gguf(f, meta, [("token_embd.weight", [8, 8], 0, 256)])
    r = run([*DIAGNOSE, "plan", "--config", str(f)], text=True)
    assert r.returncode == 2 and "general.alignment" in r.stderr and "Traceback" not in r.stderr, r.stderr
