"""The plan's weight arithmetic against what the engines measured in real logs.

Each row: a real log in ../shared/real-logs, the weights per GPU its engine printed
(vLLM "Model loading took X GiB" / "Loading weights took … X GiB", SGLang "Load weight end …
mem usage=X GB", which is GiB), the model's config.json in ../shared/reference/configs, the
checkpoint's quantisation and the tensor-parallel size the log ran. The plan must be within
3 % on the rows not named as misses, and the misses must stay misses (their cause is known).
"""

from __future__ import annotations

import re

import pytest

from diagnose.budget.architecture import shape_from_config
from diagnose.budget.config import load_config
from diagnose.budget.search import plan

from .conftest import REFERENCE, SHARED

CONFIGS = REFERENCE / "configs"
LOGS = SHARED / "real-logs"

# (log, config, quantisation, tp, GiB per GPU the engine printed)
ROWS = [
    (
        "vllm-103-healthy-v0110-llama31-8b-l4-tf-noise-serving",
        "meta-llama-Meta-Llama-3.1-8B.json",
        None,
        1,
        14.9889,
    ),
    ("vllm-409-healthy-v0171-llama31-8b-sagemaker-warn", "meta-llama-Meta-Llama-3.1-8B.json", None, 1, 14.99),
    ("vllm-412-healthy-v011-tf-noise-shutdown", "meta-llama-Meta-Llama-3.1-8B.json", None, 1, 14.9889),
    (
        "vllm-205-healthy-rocm-v0170-qwen25-7b-health-polls-clean-shutdown",
        "Qwen-Qwen2.5-7B.json",
        None,
        1,
        14.37,
    ),
    ("vllm-415-oom_startup-t4-qwen7b-profile", "Qwen-Qwen2.5-7B.json", None, 1, 14.25),
    ("vllm-403-healthy-v0112-coder14b-traffic", "Qwen-Qwen2.5-14B.json", None, 1, 27.5681),
    ("vllm-206-healthy-v085post1-r1-14b-404-wrong-model-name", "Qwen-Qwen2.5-14B.json", None, 1, 27.5916),
    (
        "vllm-215-request-oversized-prompt-18m-tokens-400-h100-v0102",
        "Qwen-Qwen3-30B-A3B.json",
        None,
        1,
        56.9342,
    ),
    ("vllm-416-request-prompt-exceeds-max-len", "Qwen-Qwen3-30B-A3B.json", None, 1, 56.9342),
    (
        "vllm-223-driver-flashinfer-jit-ld-cannot-find-lcuda-kaggle-2xt4-v0221",
        "Qwen-Qwen3-8B.json",
        None,
        2,
        7.71,
    ),
    ("vllm-405-healthy-v011-r1-distill-32b-fp8-shutdown", "Qwen-Qwen2.5-32B.json", "fp8", 1, 32.1993),
    ("vllm-404-healthy-v013-awq32b-shutdown", "Qwen-Qwen2.5-32B.json", "awq", 1, 18.1425),
    ("vllm-202-healthy-v0151-systemd-restart-awq-14b-rtx3090", "Qwen-Qwen2.5-14B.json", "awq", 1, 9.38),
    ("sglang-201-healthy-qwen25-7b-awq-no-cuda-graph-serving", "Qwen-Qwen2.5-7B.json", "awq", 1, 5.25),
    (
        "sglang-105-healthy-hicache-mooncake-debug-kv-97pct-llama32-3b",
        "meta-llama-Llama-3.2-3B.json",
        None,
        1,
        6.13,
    ),
    (
        "sglang-220-healthy-qwen25-vl-7b-docs-vision-notebook",
        "Qwen-Qwen2.5-VL-7B-Instruct.json",
        None,
        1,
        13.22,
    ),
    ("vllm-411-healthy-v013-ngc-gb10-mxfp4", "openai-gpt-oss-20b.json", None, 1, 13.7193),
    (
        "vllm-219-weights-format-gpt-oss-harmony-invalid-tiktoken-vocab-offline-tp2-v0151",
        "openai-gpt-oss-120b.json",
        None,
        2,
        32.98,
    ),
    # an FP8 checkpoint (block-wise, quantization_config in config.json) over 8 H100s, experts in EP
    ("vllm-107-healthy-v0100-tp8-qwen3-235b-fp8-ep", "Qwen-Qwen3-235B-A22B-FP8.json", None, 8, 27.6656),
    ("vllm-111-healthy-v026dev-qwen3-coder-30b-a3b-131k-tools", "Qwen-Qwen3-30B-A3B.json", None, 1, 56.93),
    # compressed-tensors W4A16 (int4, group 128) of the same MoE, TP 2
    ("vllm-406-healthy-v013-tp2-moe-long", "Qwen-Qwen3-30B-A3B.json", "awq", 2, 7.8951),
    ("sglang-014-healthy-llama31-8b-docs-notebook", "meta-llama-Meta-Llama-3.1-8B.json", None, 1, 14.42),
]
MISSES = {
    # SGLang's "mem usage" is the drop in free memory while loading: in a notebook where the
    # CUDA context and earlier allocations came first it is below the checkpoint's 14.96 GiB
    "sglang-014-healthy-llama31-8b-docs-notebook": "SGLang's mem usage is below the checkpoint's bytes",
    # SGLang's "mem usage" is the drop in free memory while loading; with the vision tower
    # the checkpoint is 15.4 GiB (8.29 B parameters in bf16), which is what the plan says.
    "sglang-220-healthy-qwen25-vl-7b-docs-vision-notebook": "SGLang's mem usage is below the checkpoint's bytes",
}

pytestmark = pytest.mark.skipif(not CONFIGS.is_dir(), reason="../shared/reference is not here")


def _error(config: str, quant: str | None, tp: int, measured: float) -> float:
    s = shape_from_config(load_config(str(CONFIGS / config)), quant)
    return plan(s, tp, 80.0, tp=tp).weights_gib_per_gpu / measured - 1


@pytest.mark.parametrize(("log", "config", "quant", "tp", "measured"), ROWS, ids=[r[0][:40] for r in ROWS])
def test_weights_per_gpu_against_the_engine(log, config, quant, tp, measured):  # type: ignore[no-untyped-def]
    err = _error(config, quant, tp, measured)
    if log in MISSES:
        assert abs(err) > 0.03, f"{log} now within 3 %: drop it from MISSES"
    else:
        assert abs(err) <= 0.03, f"{log}: plan off by {err:+.1%}"


def test_the_table_as_a_whole():  # type: ignore[no-untyped-def]
    errors = [abs(_error(c, q, t, m)) for _, c, q, t, m in ROWS]
    within = sum(e <= 0.03 for e in errors)
    assert len(ROWS) >= 22 and within / len(ROWS) >= 0.9
    assert max(errors) <= 0.25  # no row off by more than a quarter


@pytest.mark.skipif(not LOGS.is_dir(), reason="../shared/real-logs is not here")
@pytest.mark.parametrize("row", ROWS, ids=[r[0][:40] for r in ROWS])
def test_each_measurement_is_in_its_log(row):  # type: ignore[no-untyped-def]
    log, _, _, _, measured = row
    text = (LOGS / log / "log.txt").read_text(errors="replace")
    found = re.findall(
        r"(?:Model loading took|Loading weights took|Loading model weights took|mem usage=)\s*([\d.]+) ?G",
        text,
    )
    found += re.findall(r"Model loading took ([\d.]+) ?GiB", text)
    assert any(abs(float(x) - measured) < 0.005 for x in found), (log, found[:5])


# (log, config, quantisation, tp, "Available KV cache memory" GiB, "GPU KV cache size" tokens)
KV_ROWS = [
    (
        "vllm-103-healthy-v0110-llama31-8b-l4-tf-noise-serving",
        "meta-llama-Meta-Llama-3.1-8B.json",
        None,
        1,
        4.75,
        38944,
    ),
    (
        "vllm-409-healthy-v0171-llama31-8b-sagemaker-warn",
        "meta-llama-Meta-Llama-3.1-8B.json",
        None,
        1,
        55.79,
        457024,
    ),
    ("vllm-412-healthy-v011-tf-noise-shutdown", "meta-llama-Meta-Llama-3.1-8B.json", None, 1, 19.24, 157584),
    (
        "vllm-205-healthy-rocm-v0170-qwen25-7b-health-polls-clean-shutdown",
        "Qwen-Qwen2.5-7B.json",
        None,
        1,
        41.81,
        782800,
    ),
    (
        "vllm-202-healthy-v0151-systemd-restart-awq-14b-rtx3090",
        "Qwen-Qwen2.5-14B.json",
        "awq",
        1,
        11.33,
        61872,
    ),
    ("vllm-403-healthy-v0112-coder14b-traffic", "Qwen-Qwen2.5-14B.json", None, 1, 10.93, 59712),
    ("vllm-404-healthy-v013-awq32b-shutdown", "Qwen-Qwen2.5-32B.json", "awq", 1, 15.95, 65328),
    ("vllm-405-healthy-v011-r1-distill-32b-fp8-shutdown", "Qwen-Qwen2.5-32B.json", "fp8", 1, 6.04, 24736),
    (
        "vllm-215-request-oversized-prompt-18m-tokens-400-h100-v0102",
        "Qwen-Qwen3-30B-A3B.json",
        None,
        1,
        8.68,
        94784,
    ),
    ("vllm-406-healthy-v013-tp2-moe-long", "Qwen-Qwen3-30B-A3B.json", "awq", 2, 5.93, 129504),
    (
        "vllm-223-driver-flashinfer-jit-ld-cannot-find-lcuda-kaggle-2xt4-v0221",
        "Qwen-Qwen3-8B.json",
        None,
        2,
        3.92,
        57120,
    ),
    ("vllm-411-healthy-v013-ngc-gb10-mxfp4", "openai-gpt-oss-20b.json", None, 1, 12.94, 282624),
    (
        "vllm-111-healthy-v026dev-qwen3-coder-30b-a3b-131k-tools",
        "Qwen-Qwen3-30B-A3B.json",
        None,
        1,
        13.84,
        151216,
    ),
    (
        "vllm-107-healthy-v0100-tp8-qwen3-235b-fp8-ep",
        "Qwen-Qwen3-235B-A22B-FP8.json",
        None,
        8,
        35.65,
        1590736,
    ),
    (
        "vllm-219-weights-format-gpt-oss-harmony-invalid-tiktoken-vocab-offline-tp2-v0151",
        "openai-gpt-oss-120b.json",
        None,
        2,
        77.93,
        2269888,
    ),
]


@pytest.mark.parametrize(
    ("log", "config", "quant", "tp", "avail", "tokens"), KV_ROWS, ids=[r[0][:40] for r in KV_ROWS]
)
def test_kv_bytes_per_token_against_the_engine(log, config, quant, tp, avail, tokens):  # type: ignore[no-untyped-def]
    """The engine's KV memory divided by the plan's bytes per token is the engine's token count:
    GQA, TP splits, MoE, quantised weights and sliding windows (gpt-oss) all within 0.2 %. (The
    budget before it, the activation peak, is what issue 18 still has to model.)"""
    from diagnose.budget.kv import kv_bytes_per_token
    from diagnose.budget.units import GIB

    s = shape_from_config(load_config(str(CONFIGS / config)), quant)
    est = avail * GIB / kv_bytes_per_token(s, KV_DTYPE.get(log, "auto"), tp)
    assert abs(est / tokens - 1) < 0.002, f"{log}: {est:.0f} vs {tokens}"


@pytest.mark.skipif(not LOGS.is_dir(), reason="../shared/real-logs is not here")
@pytest.mark.parametrize("row", KV_ROWS, ids=[r[0][:40] for r in KV_ROWS])
def test_each_kv_measurement_is_in_its_log(row):  # type: ignore[no-untyped-def]
    log, _, _, _, avail, tokens = row
    text = (LOGS / log / "log.txt").read_text(errors="replace")
    assert f"Available KV cache memory: {avail:.2f} GiB" in text
    assert f"KV cache size: {tokens:,} tokens" in text


# The whole KV arithmetic against the engine: the tokens vLLM printed ("GPU KV cache size: N
# tokens", "# GPU blocks: N" × 16) from the GPU's total as CUDA reports it, the launch's own
# settings and the engine version (the activation peak and what is subtracted depend on them).
# GPU totals: the log's own (vllm-042/303/215), else the same card's in another real log
# (RTX 3090 23.56 GiB: vllm-053; T4 14.56 GiB: vllm-415; A100 80GB 79.25 GiB: vllm-410) or
# the reference nvidia-smi (L4: 23,034 MiB).
# (log, config, quant, tp, GiB total, utilisation, max_model_len, max_num_seqs, batched tokens
#  or None, GPU name or None, enforce_eager, version, tokens the engine printed)
PLAN_ROWS = [
    (
        "vllm-103-healthy-v0110-llama31-8b-l4-tf-noise-serving",
        "meta-llama-Meta-Llama-3.1-8B.json",
        None,
        1,
        22.49,
        0.92,
        32000,
        128,
        None,
        "NVIDIA L4",
        False,
        "0.11.0",
        38944,
    ),
    (
        "vllm-202-healthy-v0151-systemd-restart-awq-14b-rtx3090",
        "Qwen-Qwen2.5-14B.json",
        "awq",
        1,
        23.56,
        0.9,
        16384,
        8,
        None,
        "NVIDIA GeForce RTX 3090",
        False,
        "0.15.1",
        61872,
    ),
    (
        "vllm-215-request-oversized-prompt-18m-tokens-400-h100-v0102",
        "Qwen-Qwen3-30B-A3B.json",
        None,
        1,
        79.18,
        0.9,
        6144,
        None,
        None,
        "NVIDIA H100 80GB HBM3",
        False,
        "0.10.2",
        94784,
    ),
    (
        "vllm-223-driver-flashinfer-jit-ld-cannot-find-lcuda-kaggle-2xt4-v0221",
        "Qwen-Qwen3-8B.json",
        None,
        2,
        14.56,
        0.85,
        8192,
        None,
        8192,
        "Tesla T4",
        True,
        "0.22.1",
        57120,
    ),
    (
        "vllm-409-healthy-v0171-llama31-8b-sagemaker-warn",
        "meta-llama-Meta-Llama-3.1-8B.json",
        None,
        1,
        79.25,
        0.9,
        32768,
        None,
        None,
        "NVIDIA A100-SXM4-80GB",
        False,
        "0.17.1",
        457024,
    ),
    (
        "vllm-042-oom-startup-max-seq-len-29k-rtx3090-stripped",
        "meta-llama-Meta-Llama-3.1-8B.json",
        None,
        1,
        23.58,
        0.9,
        29000,
        None,
        None,
        "NVIDIA GeForce RTX 3090",
        False,
        "0.6.4",
        1478 * 16,
    ),
    (
        "vllm-303-healthy-llama3-8b-3090-v041-ready",
        "meta-llama-Meta-Llama-3.1-8B.json",
        None,
        1,
        23.69,
        0.9,
        8192,
        None,
        None,
        "NVIDIA GeForce RTX 3090",
        False,
        "0.4.1",
        2358 * 16,
    ),
    (  # FP8 weights and an fp8 KV cache (--kv-cache-dtype fp8), TP 8 with expert parallelism
        "vllm-107-healthy-v0100-tp8-qwen3-235b-fp8-ep",
        "Qwen-Qwen3-235B-A22B-FP8.json",
        None,
        8,
        79.18,
        0.9,
        32768,
        None,
        None,
        "NVIDIA H100 80GB HBM3",
        False,
        "0.10.0",
        1590736,  # the smallest rank's: the engine sizes every rank's cache by it
    ),
    (  # 0.26 subtracts the CUDA graphs it profiles (its log says 0.9000 acts as 0.8981)
        "vllm-111-healthy-v026dev-qwen3-coder-30b-a3b-131k-tools",
        "Qwen-Qwen3-30B-A3B.json",
        None,
        1,
        79.25,
        0.9,
        131072,
        16,
        None,
        "NVIDIA A100-SXM4-80GB",
        False,
        "0.26.1",
        151216,
    ),
]
KV_DTYPE = {"vllm-107-healthy-v0100-tp8-qwen3-235b-fp8-ep": "fp8"}  # the launch's --kv-cache-dtype
# rows whose GPU is the same card's in another log (not the log's own figure): within 10 %
# either way is what the total's uncertainty allows; the others within 5 %


def _planned_tokens(row: tuple) -> int:  # type: ignore[type-arg]
    import dataclasses

    log, config, quant, tp, total, util, length, seqs, batched, name, eager, version, _ = row
    s = shape_from_config(load_config(str(CONFIGS / config)), quant)
    if length > (s.max_position or length):  # Llama 3 (8192) has Llama 3.1's shapes
        s = dataclasses.replace(s, max_position=length)
    p = plan(
        s,
        tp,
        total,
        tp=tp,
        util=util,
        max_model_len=length,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        gpu_name=name,
        eager=eager,
        engine_version=version,
        kv_dtype=KV_DTYPE.get(log, "auto"),
    )
    return p.kv_tokens


@pytest.mark.parametrize("row", PLAN_ROWS, ids=[r[0][:40] for r in PLAN_ROWS])
def test_kv_tokens_against_the_engine(row):  # type: ignore[no-untyped-def]
    err = _planned_tokens(row) / row[-1] - 1
    assert abs(err) <= 0.10, f"{row[0]}: KV tokens off by {err:+.1%}"


def test_the_kv_table_as_a_whole():  # type: ignore[no-untyped-def]
    """Dense, MoE, AWQ, TP2, V0 (0.4.1, 0.6.4) and V1 (0.10.2 to 0.22.1), 15 to 80 GiB cards."""
    errors = [abs(_planned_tokens(r) / r[-1] - 1) for r in PLAN_ROWS]
    assert len(errors) >= 9 and sum(e <= 0.10 for e in errors) >= 0.8 * len(errors)
    assert sum(e <= 0.05 for e in errors) >= len(errors) - 2
    assert max(errors) <= 0.25  # no row off by more than a quarter


@pytest.mark.skipif(not LOGS.is_dir(), reason="../shared/real-logs is not here")
@pytest.mark.parametrize("row", PLAN_ROWS, ids=[r[0][:40] for r in PLAN_ROWS])
def test_each_plan_row_is_in_its_log(row):  # type: ignore[no-untyped-def]
    log, *_, version, tokens = row
    text = (LOGS / log / "log.txt").read_text(errors="replace")
    assert f"KV cache size: {tokens:,} tokens" in text or f"# GPU blocks: {tokens // 16}" in text
    label = (LOGS / log / "label.yaml").read_text()
    assert version in text or version in label  # vllm-042: the label dates it (its profiling format)


def test_the_activation_peak_follows_the_engine_generation():  # type: ignore[no-untyped-def]
    """The same GPU and model: V0 without chunked prefill profiles a whole max-length prompt
    (the activation peak grows with max_model_len); V1 profiles max_num_batched_tokens; up to 0.11
    the sorting dummy sampler holds 8.5 copies of the logits, later ones fewer; from 0.21 CUDA
    graphs are subtracted unless eager."""
    from diagnose.budget.activation import activation_gib, engine_generation, overhead_gib
    from diagnose.budget.units import engine_units

    s = shape_from_config(load_config(str(CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json")))
    v0 = plan(s, 1, 23.69, tp=1, max_model_len=8192, engine_version="0.4.1")
    assert v0.max_num_batched_tokens == 8192
    assert "V0 without chunked prefill" in v0.assumptions[0]
    v0_long = plan(s, 1, 23.69, tp=1, max_model_len=29000, engine_version="0.6.4")
    assert v0_long.activation_gib > 3 * v0.activation_gib
    v1 = plan(s, 1, 23.69, tp=1, max_model_len=8192, engine_version="0.17.1")
    assert v1.max_num_batched_tokens == 2048 and v1.kv_tokens > v0.kv_tokens * 1.07
    assert activation_gib(s, 8192, 1024, 1, engine_units("vllm"), "0.10.2") > 2 * activation_gib(
        s, 8192, 1024, 1, engine_units("vllm"), "0.17.1"
    )
    assert overhead_gib(engine_units("vllm"), "0.22.1", 1, 256, False) > overhead_gib(
        engine_units("vllm"), "0.22.1", 1, 256, True
    )
    assert overhead_gib(engine_units("vllm"), "0.17.1", 1, 256, False) == overhead_gib(
        engine_units("vllm"), "0.17.1", 1, 256, True
    )
    h100 = plan(s, 1, 79.18, tp=1, gpu_name="NVIDIA H100 80GB HBM3")
    a100 = plan(s, 1, 79.25, tp=1, gpu_name="NVIDIA A100-SXM4-80GB")
    assert (h100.max_num_batched_tokens, h100.max_num_seqs) == (8192, 1024)
    assert (a100.max_num_batched_tokens, a100.max_num_seqs) == (2048, 256)
    assert engine_generation("0.8.5") == "v1" and engine_generation("v0") == "v0"
    assert engine_generation(None) is None
    with pytest.raises(Exception, match="--engine-version"):
        engine_generation("latest")


@pytest.mark.skipif(not LOGS.is_dir(), reason="../shared/real-logs is not here")
def test_the_v0_row_is_in_its_log():  # type: ignore[no-untyped-def]
    text = (LOGS / "vllm-303-healthy-llama3-8b-3090-v041-ready" / "log.txt").read_text(errors="replace")
    assert "# GPU blocks: 2358" in text and "vLLM API server version 0.4.1" in text
    assert "enable_chunked_prefill=False" in text and "gpu_memory_utilization=0.9" in text


def test_mla_kv_pool_as_sglang_allocates_it():  # type: ignore[no-untyped-def]
    """sglang-215: DeepSeek-R1 at TP 16 on H800s. MLA keeps one latent (kv_lora_rank 512 +
    rope 64) per layer, replicated on every rank: 61 × 576 × 2 = 70,272 bytes a token. The
    memory pool took 36.48 − 22.00 GiB: the KV pool plus the request-to-token table
    (max_running_requests 2049 × context_len 163,840 × int32); the rest is 201,681 tokens."""
    from diagnose.budget.kv import kv_bytes_per_token
    from diagnose.budget.units import GIB

    s = shape_from_config(load_config(str(CONFIGS / "deepseek-ai-DeepSeek-R1.json")))
    per_token = kv_bytes_per_token(s, "auto", 16)
    assert per_token == 61 * 576 * 2
    pool = (36.48 - 22.00) * GIB - 2049 * 163840 * 4
    assert pool / per_token == pytest.approx(201681, rel=0.01)
    # and the pool as the plan sizes it: mem_fraction_static 0.7 × the 76.94 GiB free at start,
    # less the 40.46 GiB the weights took (the request table comes out of the other 30 %)
    assert (0.7 * 76.94 - 40.46) * GIB / per_token == pytest.approx(201681, rel=0.02)


@pytest.mark.skipif(not LOGS.is_dir(), reason="../shared/real-logs is not here")
def test_the_mla_row_is_in_its_log():  # type: ignore[no-untyped-def]
    text = (
        LOGS / "sglang-215-healthy-deepseek-r1-2x8-h800-tp16-startup-and-first-requests" / "log.txt"
    ).read_text(errors="replace")
    assert "Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=36.48 GB" in text
    assert "Load weight begin. avail mem=76.94 GB" in text and "mem_fraction_static=0.7" in text
    assert "Memory pool end. avail mem=22.00 GB" in text
    assert "max_total_num_tokens=201681" in text and "max_running_requests=2049" in text
    assert "context_len=163840" in text and "tp_size=16" in text


def table() -> list[tuple[str, str, float]]:
    """Every measured row with the plan's error: (what, log, error)."""
    out = [("weights", log, _error(c, q, t, m)) for log, c, q, t, m in ROWS]
    out += [("kv tokens", r[0], _planned_tokens(r) / r[-1] - 1) for r in PLAN_ROWS]
    return out


if __name__ == "__main__":  # python -m tests.test_measured: the table with the plan's errors
    rows = table()
    for what, log, err in rows:
        print(f"{what:10} {err:+7.1%}  {log}")
    for what in ("weights", "kv tokens"):
        errs = [abs(e) for w, _, e in rows if w == what]
        print(
            f"{what}: {sum(e <= (0.03 if what == 'weights' else 0.10) for e in errs)}/{len(errs)} within "
            f"{'3' if what == 'weights' else '10'} %, worst {max(errs):.1%}"
        )


def test_the_vision_encoders_profiling_peak():  # type: ignore[no-untyped-def]
    """vllm-419 (0.10.2, Qwen2-VL-2B on a 16 GiB card): "2.65 GiB for peak activation". vLLM
    profiles the encoder on its own with one image of the largest size (16,384 tokens after the
    2×2 merge: 65,536 patches through the ViT); that, not the 2048-token text pass, is the peak.
    Qwen2-VL-7B's config carries the same ViT (embed_dim 1280, depth 32, mlp_ratio 4)."""
    import dataclasses

    from diagnose.budget.activation import activation_gib
    from diagnose.budget.units import engine_units

    s = shape_from_config(load_config(str(CONFIGS / "Qwen-Qwen2-VL-7B-Instruct.json")))
    assert s.vision == (1280, 5120, 65536)
    with_encoder = activation_gib(s, 2048, 256, 1, engine_units("vllm"), "0.10.2")
    text_only = activation_gib(
        dataclasses.replace(s, vision=(0, 0, 0)), 2048, 256, 1, engine_units("vllm"), "0.10.2"
    )
    assert with_encoder == pytest.approx(2.65, rel=0.10) and with_encoder > text_only
    assert (
        activation_gib(s, 2048, 256, 1, engine_units("sglang"), None) < with_encoder
    )  # SGLang does not profile it


@pytest.mark.skipif(not LOGS.is_dir(), reason="../shared/real-logs is not here")
def test_the_vision_row_is_in_its_log():  # type: ignore[no-untyped-def]
    text = (LOGS / "vllm-419-healthy-v0102-qwen2vl-wsl" / "log.txt").read_text(errors="replace")
    assert "2.65 GiB for peak activation" in text and "Qwen2-VL-2B-Instruct" in text and "(v0.10.2)" in text
