"""Launch parameters from real argument dumps (Python literal fast path, pyparsing grammar)."""

from __future__ import annotations

import pytest

from diagnose.launch import canonical_launch, parse_repr

from .conftest import REAL_LOGS


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
    from pathlib import Path

    markers = [m for m in know.profiles.markers if m.what == "launch"]
    texts = [ex for m in markers for ex in m.examples]
    logs = sorted((Path(__file__).parent.parent / "fixtures").glob("*.log"))
    if REAL_LOGS.is_dir():
        logs += sorted(REAL_LOGS.glob("*/log.txt"))
    for log in logs:
        with log.open(encoding="utf-8", errors="replace") as fh:
            texts += [ln for ln in fh if any(n in ln for m in markers for n in m.needles)]
    out = []
    for text in texts:
        for m in markers:
            found = m.search(text)
            if found and m.kind in ("python_dict", "python_call", "python_kwargs"):
                out.append((m.kind, found.group("repr").strip()))
    return out


def test_literal_fast_path_agrees_with_the_grammar(know):
    from diagnose.launch import parse_literal, parse_with_grammar

    dumps = _launch_dumps(know)
    assert len(dumps) >= 8
    fast = 0
    for kind, text in dumps:
        lit = parse_literal(kind, text)
        if lit is not None:
            fast += 1
            assert lit == parse_with_grammar(kind, text), text[:200]
    assert fast >= 3  # the fast path is taken for the plain literal dumps


def test_literal_fast_path_declines_what_only_the_grammar_reads():
    from diagnose.launch import parse_literal

    assert parse_literal("python_call", "Namespace(a=1, f=<function serve at 0x7f>)") is None
    assert parse_literal("python_kwargs", "model=m, served_model_name=org/model, seed=0") is None
    assert parse_literal("python_dict", "{'a': 1") is None  # truncated line
    assert parse_literal("rust_debug", "Args { a: 1 }") is None
    assert parse_literal("python_call", "Namespace(**kw)") is None
    assert parse_literal("python_dict", "{'tp': 2, 'cfg': {'x': [1, 2.5]}}") == {
        "tp": 2,
        "cfg": {"x": [1, 2.5]},
    }
