"""Evidence from the engine's own numbers when the exception is missing (diagnose/consistency.py),
and the platform the log names. The lines are the engines' real formats (vLLM 0.6.3 V0,
SGLang 0.4.x, as in ../shared/real-logs); each log is cut where the exception would follow."""

from __future__ import annotations

from diagnose.pipeline.scan import scan_sources
from diagnose.pipeline.stages import diagnose
from diagnose.read.sources import resolve_sources

V0_HEAD = (
    "INFO 03-19 06:27:20 llm_engine.py:237] Initializing an LLM engine (v0.6.3.post1) with config: "
    "model='/models/Qwen2.5-32B-Instruct', speculative_config=None, tokenizer='/models/Qwen2.5-32B-Instruct', "
    "skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, trust_remote_code=False, dtype=torch.bfloat16, "
    "max_seq_len=32768, download_dir=None, tensor_parallel_size=1, pipeline_parallel_size=1, seed=0\n"
    "INFO 03-19 06:27:25 model_runner.py:1056] Starting to load model /models/Qwen2.5-32B-Instruct...\n"
    "INFO 03-19 06:28:40 model_runner.py:1067] Loading model weights took 61.0342 GB\n"
)


def _diag(know, tmp_path, text: str, engine: str | None = None):
    path = tmp_path / "cut.log"
    path.write_text(text, encoding="utf-8")
    result = scan_sources(resolve_sources([str(path)]), know, engine=engine)
    return diagnose(result, know, str(path), engine=engine)


def test_v0_rest_of_memory_negative(know, tmp_path):
    text = V0_HEAD + (
        "INFO 03-19 06:28:50 worker.py:267] model weights take 61.03GiB; non_torch_memory takes 0.16GiB; "
        "PyTorch activation peak memory takes 12.38GiB; the rest of the memory reserved for KV Cache is -1.27GiB.\n"
    )
    d = _diag(know, tmp_path, text)
    assert d.status == "failed"
    p = d.primary
    assert p is not None and p.cls == "kv_cache_too_small" and p.rule == "consistency.kv-memory-not-positive"
    assert p.facts["available_gib"] == -1.27
    assert "reserved for KV Cache is -1.27GiB" in p.evidence
    assert d.advice and d.advice[0].param in (
        "gpu_memory_utilization",
        "tensor_parallel_size",
        "max_model_len",
    )


def test_v0_blocks_below_one_request(know, tmp_path):
    text = V0_HEAD + "INFO 03-19 06:28:51 gpu_executor.py:122] # GPU blocks: 1478, # CPU blocks: 2048\n"
    d = _diag(know, tmp_path, text)
    p = d.primary
    assert p is not None and p.rule == "consistency.kv-capacity-below-max-len"
    assert (p.facts["kv_tokens"], p.facts["max_model_len"]) == (1478 * 16, 32768)
    assert d.advice[0].param == "max_model_len"


def test_v0_blocks_enough_is_no_failure(know, tmp_path):
    text = V0_HEAD + "INFO 03-19 06:28:51 gpu_executor.py:122] # GPU blocks: 4096, # CPU blocks: 2048\n"
    d = _diag(know, tmp_path, text)
    assert d.status == "incomplete" and d.primary is None


SGLANG = (
    "[2025-06-17 03:52:00] server_args=ServerArgs(model_path='Qwen/Qwen2.5-32B-Instruct', tp_size=1, "
    "mem_fraction_static=0.88, port=30000)\n"
    "[2025-06-17 03:52:28 TP0] Load weight begin. avail mem=23.26 GB\n"
    "[2025-06-17 03:52:32 TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem={after} GB, mem usage=22.24 GB.\n"
)


def test_sglang_free_after_weights_below_the_static_share(know, tmp_path):
    d = _diag(know, tmp_path, SGLANG.format(after="1.02"))
    p = d.primary
    assert p is not None and p.rule == "consistency.static-pool-empty"
    assert p.facts["min_fraction"] == 0.97  # 1 - 1.02/23.26 = 0.956, rounded up, one step above
    assert d.engine.name == "sglang"


def test_sglang_room_left_is_no_failure(know, tmp_path):
    d = _diag(know, tmp_path, SGLANG.format(after="9.69"))
    assert d.primary is None


def test_a_ready_server_is_never_judged_by_its_numbers(know, tmp_path):
    text = V0_HEAD + (
        "INFO 03-19 06:28:51 gpu_executor.py:122] # GPU blocks: 1478, # CPU blocks: 2048\n"
        "INFO:     Application startup complete.\n"
        "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)\n"
    )
    d = _diag(know, tmp_path, text)
    assert not any(f.rule.startswith("consistency.") for f in d.findings)


def test_platform_is_named(know, tmp_path):
    d = _diag(
        know,
        tmp_path,
        "INFO 05-26 18:53:34 [__init__.py:239] Automatically detected platform rocm.\n"
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 191.98 GiB of which 1.20 GiB is free.\n",
    )
    assert d.engine.platform == "rocm"
    assert d.primary is not None and d.primary.cls == "oom" and d.primary.rule == "torch.oom"
    assert d.to_json()["engine"]["platform"] == "rocm"


def test_stats_words_without_a_stats_line_are_no_internal_error(know, tmp_path):
    # vLLM's own message (mooncake connector) holds "KV cache" and "=" like a stats line; the
    # serving reader found no point in it and the report crashed ("internal error")
    d = _diag(
        know,
        tmp_path,
        'Traceback (most recent call last):\n  File "/opt/vllm/vllm/distributed/kv_transfer/x.py", line 1, in f\n'
        "RuntimeError: WITH_NVIDIA_PEERMEM=1 is incompatible with the extensible KV cache: nvidia-peermem cannot "
        "register VMM-backed memory. Unset it to use Mooncake's DMA-BUF registration, or disable the extensible KV cache.\n",
        engine="vllm",
    )
    assert d.status == "failed" and d.serving is None
    assert d.primary is not None and d.primary.cls == "config"
