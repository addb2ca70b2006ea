"""Each engine sizes its memory its own way (issue 18): `plan --engine` and `check -- <engine
command>` follow the engine's profile (`memory: kv_budget`) and speak its flags.

Layer-offload engines (llama.cpp, Ollama) are measured against what their real logs printed:
the KV buffer ("llama_kv_cache: CUDA0 KV buffer size = 640.00 MiB"), the file's size and how
many layers went to the GPU.
"""

from __future__ import annotations

import json
import sys

import pytest

from diagnose.base.errors import RuleError
from diagnose.budget.architecture import shape_from_config
from diagnose.budget.config import load_config
from diagnose.budget.kv import kv_bytes_for
from diagnose.budget.search import plan
from diagnose.budget.units import GIB, engine_units
from diagnose.budget.weights import weight_bytes

from .conftest import REFERENCE, SHARED, run

CONFIGS = REFERENCE / "configs"
LOGS = SHARED / "real-logs"
DIAGNOSE = [sys.executable, "-m", "diagnose"]

pytestmark = pytest.mark.skipif(not CONFIGS.is_dir(), reason="../shared/reference is not here")

# (log, config, GGUF type, context, sequences, context shared by the slots, KV MiB the engine
#  allocated over all devices, the file's GiB or None)
GGUF_ROWS = [
    # Ollama: num_ctx 65536 for one sequence, f16 cache
    (
        "ollama-209-oom-startup-compute-buffer-64k-ctx-llama3-8b-windows",
        "meta-llama-Meta-Llama-3.1-8B.json",
        "q4_k_m",
        65536,
        1,
        False,
        8192.0,
        None,
    ),
    # 27 layers' KV on the GPU (13,824 MiB) and one on the CPU (512 MiB)
    (
        "ollama-403-oom_startup-kv-alloc-131k-ctx",
        "meta-llama-Llama-3.2-3B.json",
        "q4_k_m",
        131072,
        1,
        False,
        14336.0,
        1.87,
    ),
    # hybrid linear attention: 10 of 40 layers keep a KV cache; -c 32768 shared by 4 slots
    (
        "llamacpp-206-healthy-qwen35-35b-a3b-q8-vision-4x-a6000",
        "Qwen-Qwen3.5-35B-A3B.json",
        "q8_0",
        32768,
        4,
        True,
        640.0,
        34.36,
    ),
    # Gemma 4: 25 sliding-window layers keep 1024 + a batch per slot, 5 global layers with their
    # own KV shape (2 heads × 512) keep the whole context
    (
        "llamacpp-404-healthy-cuda-t4-fit-abort-mlock",
        "google-gemma-4-26B-A4B.json",
        "iq4_xs",
        32768,
        2,
        True,
        1240.0,
        12.48,
    ),
]


@pytest.mark.parametrize("row", GGUF_ROWS, ids=[r[0][:40] for r in GGUF_ROWS])
def test_kv_buffer_as_llama_cpp_allocates_it(row):  # type: ignore[no-untyped-def]
    _, config, quant, ctx, seqs, shared, kv_mib, file_gib = row
    s = shape_from_config(load_config(str(CONFIGS / config)), quant)
    per_seq = ctx // seqs if shared else ctx
    assert kv_bytes_for(s, per_seq, seqs) / 2**20 == pytest.approx(kv_mib, rel=0.01)
    if file_gib:
        assert weight_bytes(s) / GIB == pytest.approx(file_gib, rel=0.03)


@pytest.mark.skipif(not LOGS.is_dir(), reason="../shared/real-logs is not here")
@pytest.mark.parametrize("row", GGUF_ROWS, ids=[r[0][:40] for r in GGUF_ROWS])
def test_each_gguf_row_is_in_its_log(row):  # type: ignore[no-untyped-def]
    log, *_, ctx, _seqs, _shared, kv_mib, file_gib = row
    text = (LOGS / log / "log.txt").read_text(errors="replace")
    sizes = [float(x) for x in __import__("re").findall(r"KV buffer size =\s+([\d.]+) MiB", text)]
    assert any(abs(sum(sizes[i : i + n]) - kv_mib) < 1 for n in (1, 2) for i in range(len(sizes))), sizes
    assert "n_ctx" in text and str(ctx) in text
    if file_gib:
        assert f"{file_gib:.2f} GiB" in text


def test_llama_server_layers_on_a_t4_as_the_log_shows():  # type: ignore[no-untyped-def]
    """llamacpp-404: Gemma 4 26B-A4B IQ4 on a T4 (14.56 GiB), -c 32768 -np 2: all 31 layers went
    to the GPU (12.48 GiB of weights, 1.21 GiB KV). Twice the context no longer fits whole: the
    plan says how many layers do, and the shorter context or q8_0 cache that would."""
    s = shape_from_config(load_config(str(CONFIGS / "google-gemma-4-26B-A4B.json")), "iq4_xs")
    units = engine_units("llamacpp")
    p = plan(s, 1, 14.56, max_model_len=32768, max_num_seqs=2, units=units)
    assert p.fits and p.gpu_layers == 31
    assert p.weights_gib_per_gpu == pytest.approx(12.48, rel=0.03)
    # llama.cpp's own fitter: "projected to use 14554 MiB of device memory"
    used = p.weights_gib_per_gpu + p.kv_gib_per_gpu + p.activation_gib
    assert used * 1024 == pytest.approx(14554, rel=0.02)
    launch = p.to_json()["launch"]
    assert launch.startswith("llama-server -m ") and "--ctx-size 32768" in launch
    assert "--n-gpu-layers 31" in launch and "--parallel 2" in launch
    big = plan(s, 1, 14.56, max_model_len=262144, max_num_seqs=2, units=units)
    assert not big.fits and 0 < big.gpu_layers < 31 and big.to_json()["launch"] is None
    assert any(w.startswith("a shorter context: --ctx-size") for w in big.what_would)
    assert any("--n-gpu-layers" in w for w in big.what_would)


def test_ollama_speaks_modelfile_parameters():  # type: ignore[no-untyped-def]
    s = shape_from_config(load_config(str(CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json")))
    p = plan(s, 1, 23.56, max_model_len=8192, units=engine_units("ollama"))
    assert p.fits and p.gpu_layers == 33  # 32 blocks + the output layer, as Ollama counts them
    assert p.to_json()["launch"].splitlines() == [
        "FROM MODEL.gguf",  # Ollama builds from a GGUF file; a bare config names none
        "PARAMETER num_ctx 8192",
        "PARAMETER num_gpu 33",
    ]
    assert any("GGUF Q4_K_M" in a for a in p.assumptions)  # no file type given: Ollama's usual
    small = plan(s, 1, 6.0, max_model_len=65536, units=engine_units("ollama"))
    assert not small.fits and any("num_ctx" in w for w in small.what_would)


def test_shares_of_memory_mean_what_each_engine_means():  # type: ignore[no-untyped-def]
    """vLLM: a share of the total holds everything; SGLang: a share of the free memory holds
    weights + KV pool; LMDeploy: a share of what is free after the weights is the KV cache;
    TensorRT-LLM the same, after its activation buffers too."""
    s = shape_from_config(load_config(str(CONFIGS / "Qwen-Qwen3-8B.json")))
    total, length = 80.0, 8192

    def kv(engine: str, util: float) -> float:
        return plan(
            s, 1, total, tp=1, util=util, max_model_len=length, units=engine_units(engine)
        ).kv_gib_per_gpu

    w = plan(s, 1, total, tp=1, max_model_len=length).weights_gib_per_gpu
    lm = plan(s, 1, total, tp=1, max_model_len=length, units=engine_units("lmdeploy"))
    assert lm.util == 0.8  # cache_max_entry_count's default
    assert lm.kv_gib_per_gpu == pytest.approx(0.8 * (total - w - lm.overhead_gib))
    assert kv("lmdeploy", 0.4) == pytest.approx(kv("lmdeploy", 0.8) / 2)
    assert kv("sglang", 0.8) == pytest.approx(0.8 * total - w)
    trt = plan(s, 1, total, tp=1, max_model_len=length, units=engine_units("trtllm"))
    assert trt.kv_gib_per_gpu == pytest.approx(0.9 * (total - w - trt.overhead_gib - trt.activation_gib))
    vllm = plan(s, 1, total, tp=1, max_model_len=length)
    assert vllm.kv_gib_per_gpu == pytest.approx(0.9 * total - w - vllm.activation_gib - vllm.overhead_gib)
    assert "--cache-max-entry-count 0.80" in lm.to_json()["launch"]
    assert "--kv_cache_free_gpu_memory_fraction 0.90" in trt.to_json()["launch"]


def test_every_profiled_launch_uses_the_engines_own_flags():  # type: ignore[no-untyped-def]
    from diagnose.knowledge.engine_profiles import load_profiles

    s = shape_from_config(load_config(str(CONFIGS / "Qwen-Qwen3-8B.json")))
    profiles = load_profiles()
    for name, prof in profiles.by_engine.items():
        units = engine_units(name, profiles)
        p = plan(s, 1, 80.0, tp=1, max_model_len=8192, units=units)
        assert p.fits, name
        launch = p.to_json()["launch"]
        if not prof.memory.get("launch"):
            assert "gpu_memory_utilization:" in launch  # the generic engine's YAML
            continue
        model = "MODEL.gguf" if units.kv_budget == "layers" else "MODEL"  # a bare config names no model
        assert launch.startswith(prof.memory["launch"].format(model=model).split("\n")[0]), name
        flag = prof.flags["max_model_len"]
        assert flag in launch, (name, launch)
        for other in profiles.by_engine.values():  # never another engine's spelling
            theirs = other.flags.get("max_model_len")
            if other is not prof and theirs and theirs != flag and theirs.startswith("--"):
                assert theirs + " " not in launch, (name, theirs)


def test_a_profile_with_a_bad_memory_section_is_named(tmp_path):  # type: ignore[no-untyped-def]
    from diagnose.knowledge.engine_profiles import parse_profile

    for memory, field in (
        ({"kv_budget": "half"}, "memory.kv_budget"),
        ({"launch": "serve"}, "memory.launch"),
        ({"reserve_gib": "lots"}, "memory.reserve_gib"),
        ({"budget": "total"}, "memory.budget"),
    ):
        with pytest.raises(RuleError, match=field.replace(".", r"\.")):
            parse_profile({"engine": "x", "memory": memory}, str(tmp_path / "x.yaml"))


def _json(args: list[str]) -> dict:  # type: ignore[type-arg]
    r = run([*DIAGNOSE, *args])
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def test_plan_cli_for_each_engine_and_a_wrong_one():  # type: ignore[no-untyped-def]
    cfg = str(CONFIGS / "Qwen-Qwen3-8B.json")
    doc = _json(
        [
            "plan",
            "--json",
            "--config",
            cfg,
            "--gpus",
            "1x24",
            "--engine",
            "lmdeploy",
            "--max-model-len",
            "8192",
        ]
    )
    assert doc["engine"] == "lmdeploy" and doc["kv_budget"] == "free_after_weights"
    assert doc["launch"].startswith("lmdeploy serve api_server")
    doc = _json(
        ["plan", "--json", "--config", cfg, "--gpus", "1x8", "--engine", "ollama", "--quantization", "q8_0"]
    )
    assert doc["kv_budget"] == "layers" and doc["gpu_layers"] < doc["layers"] and doc["launch"] is None
    r = run([*DIAGNOSE, "plan", "--config", cfg, "--engine", "nosuch"], text=True)
    assert r.returncode == 2 and "no such engine" in r.stderr and "Traceback" not in r.stderr


def _check(gpus: str, launch: str, *extra: str) -> dict:  # type: ignore[type-arg]
    cfg = str(CONFIGS / "meta-llama-Meta-Llama-3.1-8B.json")
    r = run([*DIAGNOSE, "check", "--json", "--config", cfg, "--gpus", gpus, *extra, "--", *launch.split()])
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_check_speaks_the_launchs_engine():  # type: ignore[no-untyped-def]
    doc = _check("1x8", "llama-server -m llama.gguf -ngl 99 -c 131072")
    layers = [p for p in doc["problems"] if p["param"] == "gpu_layers"]
    assert doc["engine"] == "llamacpp" and layers, doc
    assert layers[0]["change"]["flag"] == "--n-gpu-layers" and int(layers[0]["change"]["to"]) < 33
    assert "--ctx-size" in layers[0]["text"]  # the other way: a context short enough for all
    doc = _check("1x24", "lmdeploy serve api_server llama --session-len 8192 --server-port 1")
    assert doc["engine"] == "lmdeploy"
    big = _check(
        "1x24",
        "lmdeploy serve api_server llama --session-len 8192 --server-port 1 --tp 1",
        "--config",
        str(CONFIGS / "Qwen-Qwen3-32B.json"),
    )
    weights = [p for p in big["problems"] if "weights need" in p["text"]]
    # what is free after the CUDA context, not a share of a negative remainder
    assert weights and "23.2 GiB are available" in weights[0]["text"], big["problems"]
    assert not [p for p in doc["problems"] if p["param"] != "port"], doc["problems"]
    doc = _check("1x24", "vllm serve llama --max-model-len 100000 --port 1", "--engine-version", "0.6.4")
    assert any("vLLM 0.6.4 (given)" in n for n in doc["notes"])


# SGLang: the KV pool is mem_fraction_static × the memory free at start, less the weights
# ("Load weight begin. avail mem=…", "KV Cache is allocated. … #tokens: N")
# (log, config, quantisation, free GiB at start, mem_fraction_static, context_length, tokens)
SGLANG_ROWS = [
    (
        "sglang-201-healthy-qwen25-7b-awq-no-cuda-graph-serving",
        "Qwen-Qwen2.5-7B.json",
        "awq",
        15.08,
        0.82,
        32768,
        133052,
    ),
    (
        "sglang-105-healthy-hicache-mooncake-debug-kv-97pct-llama32-3b",
        "meta-llama-Llama-3.2-3B.json",
        None,
        44.11,
        0.2,
        35000,
        25169,
    ),
]


@pytest.mark.parametrize("row", SGLANG_ROWS, ids=[r[0][:40] for r in SGLANG_ROWS])
def test_sglang_pool_against_the_engine(row):  # type: ignore[no-untyped-def]
    _, config, quant, free, frac, ctx, tokens = row
    s = shape_from_config(load_config(str(CONFIGS / config)), quant)
    p = plan(s, 1, free, tp=1, util=frac, max_model_len=ctx, units=engine_units("sglang"))
    assert p.kv_tokens == pytest.approx(tokens, rel=0.06)  # the weights' estimate is the error


@pytest.mark.skipif(not LOGS.is_dir(), reason="../shared/real-logs is not here")
@pytest.mark.parametrize("row", SGLANG_ROWS, ids=[r[0][:40] for r in SGLANG_ROWS])
def test_each_sglang_row_is_in_its_log(row):  # type: ignore[no-untyped-def]
    log, _, _, free, frac, _, tokens = row
    text = (LOGS / log / "log.txt").read_text(errors="replace")
    assert f"Load weight begin. avail mem={free:.2f} GB" in text
    assert f"mem_fraction_static={frac}" in text and f"#tokens: {tokens}" in text


def test_sglang_leaves_room_for_activations_and_graphs():  # type: ignore[no-untyped-def]
    """SGLang's static share holds weights and the KV pool; its prefill activations, CUDA graphs
    and the context live in the rest. A share that leaves too little is the classic startup
    OOM: the plan says so and proposes the largest share that leaves them room."""
    s = shape_from_config(load_config(str(CONFIGS / "Qwen-Qwen3-8B.json")))
    units = engine_units("sglang")
    tight = plan(s, 1, 24.0, tp=1, util=0.97, max_model_len=8192, units=units)
    assert not tight.fits and any(r.startswith("activations need") for r in tight.reasons)
    share = next(w for w in tight.what_would if "--mem-fraction-static" in w)
    to = float(share.split("--mem-fraction-static ")[1].split()[0])
    assert 0.8 <= to < 0.97 and plan(s, 1, 24.0, tp=1, util=to, max_model_len=8192, units=units).fits
    assert plan(s, 1, 24.0, tp=1, max_model_len=8192, units=units).fits  # its default 0.88 does
    cfg = str(CONFIGS / "Qwen-Qwen3-8B.json")
    launch = "python -m sglang.launch_server --model-path m --mem-fraction-static 0.97 --context-length 8192 --port 1"
    r = run([*DIAGNOSE, "check", "--json", "--config", cfg, "--gpus", "1x24", "--", *launch.split()])
    ch = [p["change"] for p in json.loads(r.stdout)["problems"] if p["param"] == "gpu_memory_utilization"]
    assert ch and ch[0]["flag"] == "--mem-fraction-static" and ch[0]["to"] == f"{to:.2f}"
