"""Advice values: the grids, the bounds, and properties no advice may break."""

from __future__ import annotations

import itertools

import pytest

from diagnose.advice.core import divisors_at_most, len_down, util_down, util_up
from diagnose.advice.registry import advise
from diagnose.model.records import Finding


def test_utilisation_grid():
    assert (
        util_down(0.95) == 0.90
        and util_down(0.99) == 0.95
        and util_down(0.9) == 0.85
        and util_down(0.92) == 0.90
    )
    assert util_up(0.9) == 0.95 and util_up(0.89) == 0.90 and util_up(0.95) is None and util_up(0.97) is None


def test_context_length_rounding():
    assert len_down(69000) == 65536  # the example: 131072 → 65536
    assert len_down(121840) == 120832 and len_down(23648) == 23552 and len_down(4096) == 4096
    for n in range(1024, 300_000, 997):
        v = len_down(n)
        assert v <= n and v % 1024 == 0 and v > 0


def _f(cls, **facts):
    return Finding(
        rule="t", cls=cls, severity="fatal", title="t", line=1, source="s", evidence="e", facts=facts
    )


@pytest.mark.parametrize(
    "heads,gpus,tp",
    list(itertools.product([8, 12, 14, 16, 28, 32, 40, 64, 96], [1, 2, 3, 4, 6, 8], [3, 5, 6, 7, 12])),
)
def test_parallel_size_never_exceeds_gpus_or_breaks_heads(know, heads, gpus, tp):
    f = _f("tp_mismatch", heads=heads, gpus=gpus, tensor_parallel_size=tp)
    for c in advise(f, "vllm", {"tensor_parallel_size": tp}, know.profiles):
        if c.param == "tensor_parallel_size":
            v = int(c.to)
            assert v <= gpus and heads % v == 0 and v >= 1


@pytest.mark.parametrize("util", [0.5, 0.85, 0.9, 0.92, 0.95, 0.97, 0.99])
@pytest.mark.parametrize(
    "cls,phase",
    [
        ("oom", "startup"),
        ("oom", "runtime"),
        ("kv_cache_too_small", "startup"),
        ("preemption", None),
        ("gpu_busy", None),
    ],
)
def test_utilisation_never_above_095(know, util, cls, phase):
    f = _f(cls, free_gib=30.0, total_gib=79.19)
    f.oom_phase = phase
    for c in advise(f, "vllm", {"gpu_memory_utilization": util}, know.profiles):
        if c.param == "gpu_memory_utilization":
            v = float(c.to)
            assert v <= 0.95 and round(v * 100) % 5 == 0


@pytest.mark.parametrize("est,cur", [(69000, 131072), (121840, 262144), (23648, 29000), (1500, 4096)])
def test_max_model_len_at_or_below_what_fits(know, est, cur):
    f = _f("kv_cache_too_small", est_max_len=est, max_model_len=cur)
    first = advise(f, "vllm", {}, know.profiles)[0]
    assert first.param == "max_model_len" and first.flag == "--max-model-len"
    assert int(first.to) <= est and first.frm == str(cur)


def test_engine_spelling_of_flags(know):
    f = _f("kv_cache_too_small", mem_fraction_static=0.7)
    first = advise(f, "sglang", {"gpu_memory_utilization": 0.7}, know.profiles)[0]
    assert (first.param, first.flag, first.frm, first.to) == (
        "gpu_memory_utilization",
        "--mem-fraction-static",
        "0.70",
        "0.75",
    )
    f = _f("tp_mismatch", heads=32, tensor_parallel_size=3)
    first = advise(f, "tgi", {}, know.profiles)[0]
    assert first.flag == "--num-shard" and first.to == "2"


def test_divisors():
    assert divisors_at_most(16, 6) == [1, 2, 4] and divisors_at_most(40, 8) == [1, 2, 4, 5, 8]


def test_no_advice_without_a_finding(know):
    assert advise(None, "vllm", {}, know.profiles) == []


@pytest.mark.parametrize("phase", ["load", "startup", "runtime"])
def test_generic_engine_gets_its_own_keys_first(know, phase):
    """The seed guides' engine has a few config keys: those come first; other changes follow
    under their canonical names, never another engine's flags."""
    f = _f("oom", tried_gib=2.0)
    f.oom_phase = phase
    launch = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "max_num_seqs": 8}
    changes = advise(f, "generic", launch, know.profiles)
    declared = know.profiles.get("generic").flags
    known = [c.param in declared or c.param.startswith(("env:", "action:")) for c in changes]
    assert changes and known == sorted(known, reverse=True)
    for c, k in zip(changes, known, strict=True):
        assert k or c.flag == c.param
    vllm = advise(f, "vllm", launch, know.profiles)
    assert all(
        c.flag.startswith(("--", "env:")) or "=" in c.flag or c.param.startswith("action:") for c in vllm
    )


def test_no_other_process_to_stop_when_the_failing_one_holds_the_memory(know):
    # "GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free. Including non-PyTorch
    # memory, this process has 78.16 GiB memory in use": nobody else is on the GPU
    alone = _f("oom", total_gib=79.19, free_gib=1.02, process_gib=78.16, self_listed=True)
    alone.oom_phase = "load"
    assert "action:free_gpu" not in [c.param for c in advise(alone, "vllm", {}, know.profiles)]
    # the same GPU with 30 GiB unaccounted for by this process: someone else holds it
    shared = _f("oom", total_gib=79.19, free_gib=1.02, process_gib=48.16, self_listed=True)
    shared.oom_phase = "load"
    assert "action:free_gpu" in [c.param for c in advise(shared, "vllm", {}, know.profiles)]


def _scan_text(know, tmp_path, text):  # type: ignore[no-untyped-def]
    from diagnose.pipeline.scan import scan_paths

    p = tmp_path / "serve.log"
    p.write_text(text)
    return scan_paths([str(p)], know)


def test_load_oom_on_one_small_card_advises_fewer_bytes_not_more_gpus(know, tmp_path):
    """A 16 GB card with tensor_parallel_size 1: no second GPU to split over."""
    d = _scan_text(
        know,
        tmp_path,
        "INFO 05-26 18:53:37 [api_server.py:1043] vLLM API server version 0.8.5.post1\n"
        "INFO 05-26 18:53:37 [api_server.py:1044] args: Namespace(model_tag='google/gemma-3-12b-it', "
        "tensor_parallel_size=1)\n"
        "INFO 05-26 18:53:50 [gpu_model_runner.py:1] Starting to load model google/gemma-3-12b-it...\n"
        "ERROR 05-26 18:54:10 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "114.00 MiB. GPU 0 has a total capacity of 15.58 GiB of which 54.38 MiB is free. Including non-PyTorch "
        "memory, this process has 15.42 GiB memory in use.\n",
    )
    assert d.primary is not None and d.primary.oom_phase == "load"
    assert d.advice[0].param == "quantization"
    assert "tensor_parallel_size" not in [c.param for c in d.advice[:2]]


def test_startup_oom_when_the_weights_fill_the_budget_advises_fewer_bytes(know, tmp_path):
    """14.25 GiB of weights on a 14.56 GiB T4 at utilisation 0.85: nothing left for profiling."""
    d = _scan_text(
        know,
        tmp_path,
        "(EngineCore pid=4) INFO 04-26 12:04:51 [gpu_model_runner.py:4820] Model loading took 14.25 GiB memory "
        "and 53.5 seconds\n"
        "(EngineCore pid=4) INFO 04-26 12:04:52 [gpu_worker.py:1] Memory profiling takes 1.0 seconds\n"
        "(EngineCore pid=4) ERROR 04-26 12:05:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried "
        "to allocate 1.02 GiB. GPU 0 has a total capacity of 14.56 GiB of which 111.81 MiB is free.\n",
    )
    assert d.primary is not None and d.primary.oom_phase == "startup"
    assert d.advice[0].param == "quantization"
    assert "14.25 GiB" in d.advice[1].why or "14.25 GiB" in d.advice[0].why or d.advice[1].param == "model"


def test_layered_engine_oom_follows_the_buffer_that_failed(know, tmp_path):
    """llama.cpp: tensor buffers → fewer GPU layers; KV/compute buffers → a shorter context."""
    head = (
        "llama_model_loader: loaded meta data with 29 key-value pairs and 292 tensors from m.gguf (version GGUF V3 (latest))\n"
        "load_tensors: offloaded 33/33 layers to GPU\n"
    )
    d = _scan_text(
        know,
        tmp_path,
        head
        + "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 9000.00 MiB on device 0: cudaMalloc failed: "
        "out of memory\nllama_model_load: error loading model: unable to allocate CUDA0 buffer\n",
    )
    assert d.engine.name == "llamacpp" and d.primary.oom_phase == "load"
    assert (
        d.advice[0].param == "gpu_layers" and d.advice[0].to == "24" and d.advice[0].flag == "--n-gpu-layers"
    )
    d = _scan_text(
        know,
        tmp_path,
        head + "llama_context: constructing llama_context\nllama_context: n_ctx         = 65536\n"
        "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache\n",
    )
    assert d.primary.oom_phase == "startup"
    assert (
        d.advice[0].param == "max_model_len"
        and d.advice[0].to == "32768"
        and d.advice[0].flag == "--ctx-size"
    )


def test_ollama_advice_is_spelled_in_ollama_settings(know, tmp_path):
    d = _scan_text(
        know,
        tmp_path,
        'time=2025-03-07T08:41:43.913Z level=DEBUG source=cache.go:104 msg="loading cache slot" id=0 prompt=95938\n'
        "CUDA error: out of memory\n"
        "  current device: 2, in function alloc at //ml/backend/ggml/ggml/src/ggml-cuda/ggml-cuda.cu:445\n",
    )
    assert d.engine.name == "ollama" and d.primary.oom_phase == "runtime"
    assert d.advice[0].param == "max_model_len" and d.advice[0].flag == "num_ctx"


def test_a_stop_during_startup_says_what_that_phase_waits_on(know, tmp_path):
    d = _scan_text(
        know,
        tmp_path,
        "INFO 05-26 18:53:37 [api_server.py:1043] vLLM API server version 0.8.5.post1\n"
        "INFO 05-26 18:53:37 [api_server.py:1044] args: Namespace(model_tag='openai/gpt-oss-20b', port=8000)\n"
        "KeyboardInterrupt\n",
    )
    assert d.status == "incomplete"
    assert d.advice and d.advice[0].param == "env:HF_HUB_OFFLINE"


def test_env_advice_never_becomes_a_bare_1(know, tmp_path):
    d = _scan_text(
        know,
        tmp_path,
        "INFO 05-26 18:53:37 [api_server.py:1043] vLLM API server version 0.8.5.post1\n"
        "ERROR 05-01 10:00:00 [pynccl_wrapper.py:300] Failed to load NCCL library from libnccl.so.2. It is "
        "expected if you are not running on NVIDIA/AMD GPUs.\n",
    )
    c = d.advice[0]
    assert c.param == "env:VLLM_NCCL_SO_PATH" and c.to != "1" and "libnccl" in c.to


def test_tensor_parallel_advice_starts_from_the_workers_the_log_ran(know):
    """Four ranks failed in the log: doubling starts from 4, not from the default 1."""
    f = _f("oom", total_gib=79.2)
    f.oom_phase, f.ranks = "load", [0, 1, 2, 3]
    changes = advise(f, "vllm", {}, know.profiles)
    tp = next(c for c in changes if c.param == "tensor_parallel_size")
    assert tp.frm == "4" and tp.to == "8"


def test_no_smaller_budget_when_another_process_holds_the_gpu(know):
    f = _f("oom", total_gib=80.0, other_gib=76.0, other_pid=99, self_listed="x", free_gib=0.1)
    f.oom_phase = "startup"
    changes = advise(f, "vllm", {"gpu_memory_utilization": 0.9}, know.profiles)
    assert "gpu_memory_utilization" not in [c.param for c in changes]
    assert changes[0].param == "action:free_gpu"
