"""Launch parameters from real argument dumps: the hand-written reader, checked against the
pyparsing grammar it replaced."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.launch import canonical_launch, parse_repr, read_dump

from .conftest import FIXTURES, REAL_LOGS
from .launch_grammar import parse_with_grammar


def test_vllm_v0_namespace_with_nested_values():
    text = (
        "Namespace(subparser='serve', model_tag='Qwen/Qwen2.5-32B-Instruct', host='0.0.0.0', port=8000, "
        "allowed_origins=['*'], lora_modules=None, tensor_parallel_size=4, gpu_memory_utilization=0.9, "
        "max_model_len=None, enforce_eager=False, dispatch_function=<function serve at 0x7f3b2c1d5e40>, "
        "override_pooler_config=None, compilation_config=None, kv_transfer_config=None, "
        "download_dir=PosixPath('/models'), chat_template=\"{% for m in messages %}{{ m['content'] }}{% endfor %}\")"
    )
    d = parse_repr("python_call", text)
    assert d["model_tag"] == "Qwen/Qwen2.5-32B-Instruct" and d["tensor_parallel_size"] == 4
    assert d["gpu_memory_utilization"] == 0.9 and d["max_model_len"] is None and d["enforce_eager"] is False
    assert d["allowed_origins"] == ["*"] and d["download_dir"] == "/models"
    assert "{{ m['content'] }}" in d["chat_template"]


def test_vllm_v1_non_default_args_dict():
    d = parse_repr(
        "python_dict",
        "{'model_tag': 'x', 'max_model_len': 262144, 'gpu_memory_utilization': 0.89, "
        "'speculative_config': {'model': 'y', 'num_speculative_tokens': 15}, 'enable_auto_tool_choice': True}",
    )
    assert d["max_model_len"] == 262144 and d["speculative_config"]["num_speculative_tokens"] == 15


def test_engine_config_kwargs_run_to_end_of_line():
    d = parse_repr(
        "python_kwargs",
        "model='m', speculative_config=None, dtype=torch.bfloat16, max_seq_len=32768, "
        "tensor_parallel_size=2, quantization=None, enforce_eager=False, device_config=cuda, "
        'compilation_config={"level":3,"splitting_ops":["vllm.unified_attention"],"use_inductor":true}',
    )
    assert d["tensor_parallel_size"] == 2 and d["max_seq_len"] == 32768 and d["dtype"] == "torch.bfloat16"
    assert d["compilation_config"]["use_inductor"] is True


def test_sglang_server_args_and_tgi_args():
    d = parse_repr(
        "python_call", "ServerArgs(model_path='m', tp_size=2, mem_fraction_static=0.88, context_length=None)"
    )
    assert canonical_launch(
        d,
        {
            "model_path": "model",
            "tp_size": "tensor_parallel_size",
            "mem_fraction_static": "gpu_memory_utilization",
        },
    ) == {"model": "m", "tensor_parallel_size": 2, "gpu_memory_utilization": 0.88}
    t = parse_repr(
        "rust_debug",
        'Args { model_id: "HuggingFaceH4/zephyr-7b-beta", revision: None, num_shard: Some(2), '
        'cuda_memory_fraction: 1.0, hostname: "0.0.0.0", port: 3000, json_output: false, }',
    )
    assert t["num_shard"] == 2 and t["model_id"] == "HuggingFaceH4/zephyr-7b-beta" and t["revision"] is None


def test_command_line():
    d = parse_repr(
        "command_line",
        "vllm serve Qwen/Qwen2.5-32B-Instruct --port 8000 --gpu-memory-utilization 0.9 "
        "--tensor-parallel-size 4 --enforce-eager --max-model-len=8192",
    )
    assert d == {
        "model": "Qwen/Qwen2.5-32B-Instruct",
        "port": 8000,
        "gpu_memory_utilization": 0.9,
        "tensor_parallel_size": 4,
        "enforce_eager": True,
        "max_model_len": 8192,
    }


def test_garbage_gives_empty_mapping():
    assert parse_repr("python_call", "Namespace(") == {}
    assert parse_repr("rust_debug", "}}}") == {}


@pytest.mark.skipif(not REAL_LOGS.is_dir(), reason="../shared/real-logs not present")
def test_real_v0_namespace_dump(know):
    from diagnose.pipeline import scan_paths

    d = scan_paths(
        [str(REAL_LOGS / "vllm-112-tp-mismatch-v085-ray-placement-group-tp4-wait" / "log.txt")], know
    )
    assert d.launch["tensor_parallel_size"] == 4 and d.launch["gpu_memory_utilization"] == 0.9
    assert d.launch["model"] == "Qwen/Qwen2.5-32B-Instruct" and d.launch["port"] == 8000


def _launch_dumps(know) -> list[tuple[str, str]]:
    """Every argument dump we can find: the engine profiles' examples, the fixture logs and,
    when present, the real-log corpus."""
    markers = [m for m in know.profiles.markers if m.what == "launch"]
    texts = [ex for m in markers for ex in m.examples]
    logs = sorted(FIXTURES.glob("logs/*/*.log"))
    if REAL_LOGS.is_dir():
        logs += sorted(REAL_LOGS.glob("*/log.txt"))
    for log in logs:
        with log.open(encoding="utf-8", errors="replace") as fh:
            texts += [ln for ln in fh if any(n in ln for m in markers for n in m.needles)]
    out = []
    for text in texts:
        for m in markers:
            found = m.search(text)
            if found and m.kind in ("python_dict", "python_call", "python_kwargs", "rust_debug"):
                out.append((m.kind, found.group("repr").strip()))
    return out


def test_reader_agrees_with_the_grammar_on_every_dump(know):
    dumps = _launch_dumps(know)
    assert len(dumps) >= 20
    assert {k for k, _ in dumps} >= {"python_dict", "python_call", "python_kwargs", "rust_debug"}
    for kind, text in dumps:
        assert read_dump(kind, text) == parse_with_grammar(kind, text), text[:200]


# Dumps as engines print them, with the oddities the reader must treat as the grammar did:
# bare words, enum reprs, escapes, JSON constants, Rust Some(..), trailing commas, truncation.
_ident = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,8}", fullmatch=True)
_bare = st.from_regex(r"[A-Za-z/][A-Za-z0-9_./:= -]{0,12}", fullmatch=True)
_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


def _quoted(s: str) -> str:
    q = "'" if '"' in s or "\n" in s else '"'
    return q + s.replace("\\", "\\\\").replace(q, "\\" + q).replace("\n", "\\n").replace("\r", "\\r") + q


_scalar = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.sampled_from(["None", "True", "False", "true", "false", "null", "1e-3", ".5", "+3", "0x10", "1_000"]),
    _text.map(_quoted),
    _bare,
    st.sampled_from(["<LoadFormat.AUTO: 'auto'>", "<function serve at 0x7f3b>", "torch.bfloat16"]),
)
_sep = st.sampled_from([", ", ",", " , ", ",\t", ", ,"])


def _values(children):
    seqs = st.lists(children, max_size=4)
    return st.one_of(
        st.tuples(seqs, _sep, st.booleans()).map(
            lambda t: "[" + t[1].join(t[0]) + ("," if t[2] else "") + "]"
        ),
        st.tuples(seqs, _sep).map(lambda t: "(" + t[1].join(t[0]) + ")"),
        st.tuples(st.lists(st.tuples(children, children), max_size=3), _sep).map(
            lambda t: "{" + t[1].join(f"{k}: {v}" for k, v in t[0]) + "}"
        ),
        st.tuples(
            _ident, st.lists(st.tuples(_ident, children), max_size=3), st.lists(children, max_size=1)
        ).map(lambda t: t[0] + "(" + ", ".join([*(f"{k}={v}" for k, v in t[1]), *t[2]]) + ")"),
        st.tuples(_ident, st.lists(st.tuples(_ident, children), max_size=3)).map(
            lambda t: t[0] + " { " + ", ".join(f"{k}: {v}" for k, v in t[1]) + " }"
        ),
    )


_value = st.recursive(_scalar, _values, max_leaves=12)


@st.composite
def _dump(draw) -> tuple[str, str]:
    kind = draw(st.sampled_from(["python_kwargs", "python_call", "python_dict", "rust_debug"]))
    pairs = draw(st.lists(st.tuples(_ident, _value), min_size=1, max_size=5))
    sep = draw(_sep)
    if kind == "python_kwargs":
        text = sep.join(f"{k}={v}" for k, v in pairs)
    elif kind == "python_call":
        text = draw(_ident) + "(" + sep.join(f"{k}={v}" for k, v in pairs) + ")"
    elif kind == "python_dict":
        text = "{" + sep.join(f"{_quoted(k)}: {v}" for k, v in pairs) + "}"
    else:
        text = "Args { " + sep.join(f"{k}: {v}" for k, v in pairs) + " }"
    if draw(st.booleans()):  # a line cut short
        text = text[: draw(st.integers(0, len(text)))]
    return kind, text.strip()


@settings(max_examples=400, deadline=None)
@given(_dump())
def test_reader_agrees_with_the_grammar_on_generated_dumps(dump):
    kind, text = dump
    assert read_dump(kind, text) == parse_with_grammar(kind, text)


def test_reader_survives_deep_nesting_and_junk():
    assert read_dump("python_call", "f(" * 5000) == {}
    assert read_dump("python_kwargs", "a=" + "[" * 5000) == {}
    assert read_dump("rust_debug", 'Args { model_id: Some("m"), num_shard: Some(2), x: None }') == {
        "model_id": "m",
        "num_shard": 2,
        "x": None,
    }
