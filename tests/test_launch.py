"""Launch parameters from real argument dumps, and from dumps generated from known values."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.read.launch_args import canonical_launch, parse_repr, read_dump

from .conftest import FIXTURES, REAL_LOGS


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
    from diagnose.pipeline.scan import scan_paths

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


def test_reader_reads_every_real_dump(know):
    """Every dump of the real logs and fixtures reads to a mapping with its settings (one
    setting a dump at least: the reader never gives up on a whole real dump)."""
    dumps = _launch_dumps(know)
    assert len(dumps) >= 20
    assert {k for k, _ in dumps} >= {"python_dict", "python_call", "python_kwargs", "rust_debug"}
    for kind, text in dumps:
        got = read_dump(kind, text)
        has_a_pair = re.search(r"\w\s*(?:=|:)\s*[^\s{]", text) is not None  # not "Args {" alone
        assert isinstance(got, dict) and (bool(got) or not has_a_pair), text[:200]


# Dumps as engines print them, generated from known values: the reader must give those values
# back (Python reprs for vLLM/SGLang/LMDeploy, Rust's Debug for TGI).
_ident = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12)
_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    _text,
)
_value = st.one_of(_leaf, st.lists(st.one_of(st.integers(0, 99), _text), max_size=4))
_sep = st.sampled_from([", ", ",", " , "])


def _rust(v: object) -> str:
    if v is None:
        return "None"
    if isinstance(v, bool):
        return "Some(true)" if v else "Some(false)"
    if isinstance(v, str):
        return "Some(" + json.dumps(v, ensure_ascii=False) + ")"
    if isinstance(v, list):
        return "[" + ", ".join(json.dumps(x, ensure_ascii=False) for x in v) + "]"
    return f"Some({v!r})"


@st.composite
def _dump(draw) -> tuple[str, str, dict]:
    kind = draw(st.sampled_from(["python_kwargs", "python_call", "python_dict", "rust_debug"]))
    pairs = dict(draw(st.lists(st.tuples(_ident, _value), min_size=1, max_size=5, unique_by=lambda p: p[0])))
    sep = draw(_sep)
    if kind == "python_kwargs":
        text = sep.join(f"{k}={v!r}" for k, v in pairs.items())
    elif kind == "python_call":
        text = "Namespace(" + sep.join(f"{k}={v!r}" for k, v in pairs.items()) + ")"
    elif kind == "python_dict":
        text = "{" + sep.join(f"{k!r}: {v!r}" for k, v in pairs.items()) + "}"
    else:
        text = "Args { " + sep.join(f"{k}: {_rust(v)}" for k, v in pairs.items()) + " }"
    return kind, text, pairs


@settings(max_examples=400, deadline=None)
@given(_dump())
def test_reader_gives_back_the_values_of_generated_dumps(dump):
    kind, text, want = dump
    assert read_dump(kind, text) == want, text


@settings(max_examples=300, deadline=None)
@given(_dump(), st.integers(0, 400))
def test_a_dump_cut_short_reads_to_a_mapping_or_nothing(dump, cut):
    kind, text, _ = dump
    assert isinstance(read_dump(kind, text[:cut]), dict)


def test_a_dump_cut_short_keeps_its_whole_pairs():
    # as pasted in an issue: the line ends in "…" before the closing parenthesis
    text = "ServerArgs(model_path='meta-llama/Llama-3.1-70B-Instruct', tp_size=8, mem_fraction_static=0.88, num_conti…"
    assert read_dump("python_call", text) == {
        "model_path": "meta-llama/Llama-3.1-70B-Instruct",
        "tp_size": 8,
        "mem_fraction_static": 0.88,
    }
    assert read_dump("rust_debug", 'Args { model_id: "/data/m", num_shard: Some(2), ...') == {
        "model_id": "/data/m",
        "num_shard": 2,
    }
    # the last value may itself be cut (4096 → 40): only pairs a comma closes are taken
    assert read_dump("python_call", "Namespace(port=8000, max_model_len=40") == {"port": 8000}


def test_reader_survives_deep_nesting_and_junk():
    assert read_dump("python_call", "f(" * 5000) == {}
    assert read_dump("python_kwargs", "a=" + "[" * 5000) == {}
    assert read_dump("rust_debug", 'Args { model_id: Some("m"), num_shard: Some(2), x: None }') == {
        "model_id": "m",
        "num_shard": 2,
        "x": None,
    }


def test_a_dump_parsed_again_is_read_once_and_handed_out_as_its_own_copy():
    """Replicas print the same config line: the parse is reused, and each caller gets a
    mapping of its own (updating one does not change the next)."""
    text = "model='meta-llama/Llama-3.1-8B-Instruct', tensor_parallel_size=2, max_model_len=32768, seed=0"
    first = parse_repr("python_kwargs", text)
    first["max_model_len"] = 1
    second = parse_repr("python_kwargs", "  " + text)
    assert second == {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "tensor_parallel_size": 2,
        "max_model_len": 32768,
        "seed": 0,
    }
