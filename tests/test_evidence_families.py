"""The evidence every log already carries, read by general mechanisms (issue: right on real logs
nobody tuned it to). Each test is built from the engines' and libraries' own texts (their
printing statements, as the reference catalogues and the mined sources give them), never from
one corpus log's line.
"""

from __future__ import annotations

import pytest

from diagnose.match.scanner import Scanner  # noqa: F401  (the module the scans below go through)
from diagnose.pipeline.scan import scan_sources
from diagnose.pipeline.stages import diagnose
from diagnose.read.sources import Source


def scan(tmp_path, know, text: str, engine: str | None = None):  # type: ignore[no-untyped-def]
    p = tmp_path / "serve.log"
    p.write_text(text)
    return diagnose(scan_sources([Source("serve.log", str(p))], know, engine), know, "serve.log", engine)


def first(d) -> str | None:  # type: ignore[no-untyped-def]
    return d.advice[0].param if d.advice else None


# torch's allocator message (c10/cuda/CUDACachingAllocator.cpp, torch >= 2.1)
TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 9.06 MiB is free.{procs} Of the allocated memory 7.50 GiB is "
    "allocated by PyTorch, and 21.00 MiB is reserved by PyTorch but unallocated."
)


# --- the OOM phase, read from what the log shows before defaulting ---------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/venv/lib/python3.9/site-packages/vllm-0.1.2-py3.9-linux-x86_64.egg/vllm/model_executor/models/llama.py",
        "/workspace/vllm/model_executor/models/llama.py",  # a source tree
        "/opt/envs/renamed/lib/python3.10/site-packages/vllm/model_executor/models/llama.py",
    ],
)
def test_the_engine_is_known_from_its_own_sub_packages_whatever_the_install(tmp_path, know, path):
    """An egg, a source checkout, a renamed venv: a `vllm/` folder holding one of vLLM's own
    sub-packages names the engine, and with it the call tree that types the OOM (a model's
    constructor is weight loading)."""
    text = (
        "Traceback (most recent call last):\n"
        f'  File "{path}", line 200, in __init__\n'
        "    self.layers = nn.ModuleList(\n" + TORCH_OOM.format(procs="") + "\n"
    )
    d = scan(tmp_path, know, text)
    assert d.engine.name == "vllm"
    assert d.primary.cls == "oom" and d.primary.oom_phase == "load"


def test_a_shard_that_cannot_start_failed_while_loading(tmp_path, know):
    """TGI's launcher (launcher/src/main.rs): ShardCannotStart / "Shard N failed to start" names
    the step: a shard reports ready only after it loaded the model."""
    text = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 128.00 MiB (GPU 0; 15.77 "
        "GiB total capacity; 15.37 GiB already allocated; 13.62 MiB free)\n"
        "Error: ShardCannotStart\n"
        "2023-08-17T10:23:27.032737Z ERROR text_generation_launcher: Shard 0 failed to start\n"
    )
    d = scan(tmp_path, know, text, engine="tgi")
    assert d.primary.cls == "oom" and d.primary.oom_phase == "load"
    assert "the wrapper names the step" in (d.primary.phase_evidence or "")


@pytest.mark.parametrize(
    ("method", "phase"),
    [("load_model", "load"), ("determine_num_available_blocks", "startup"), ("execute_model", "runtime")],
)
def test_an_executor_rpc_gives_its_phase_to_the_failures_of_that_second(tmp_path, know, method, phase):
    """V0's multiproc executor: "Exception in worker … while processing method X" from one rank,
    the OOM from another in the same second: X's phase, by vLLM's own call-tree roots."""
    text = (
        "(VllmWorkerProcess pid=195295) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] "
        + TORCH_OOM.format(procs="")
        + "\n(VllmWorkerProcess pid=195297) ERROR 03-02 19:49:43 [multiproc_worker_utils.py:242] "
        f"Exception in worker VllmWorkerProcess while processing method {method}.\n"
    )
    d = scan(tmp_path, know, text, engine="vllm")
    assert d.primary.cls == "oom" and d.primary.oom_phase == phase


# --- waits and retry loops -------------------------------------------------------------------


def test_a_log_that_ends_in_the_core_engine_heartbeat_is_at_distributed_init(tmp_path, know):
    """V1's API server (v1/engine/utils.py wait_for_engine_startup) every 10 s: where it stands,
    and that phase's hang advice."""
    beat = (
        "(APIServer pid=1) DEBUG 08-09 20:56:{s:02d} [v1/engine/utils.py:1262] Waiting for 1 local, "
        "0 remote core engine proc(s) to start.\n"
    )
    d = scan(tmp_path, know, "".join(beat.format(s=s) for s in range(0, 60, 10)), engine="vllm")
    assert d.status == "incomplete" and d.last_phase == "distributed_init"
    assert first(d) == "env:NCCL_DEBUG"


def test_nccls_own_init_lines_mark_distributed_init_in_every_engine(tmp_path, know):
    """NCCL's communicator set-up (src/init.cc, at NCCL_DEBUG=INFO) in an SGLang log: the phase
    is known, and NCCL_DEBUG=INFO, already in force, is not proposed."""
    text = (
        "[2025-01-23 19:35:00] server_args=ServerArgs(model_path='m', tp_size=16)\n"
        "gpu125:466532:466532 [4] NCCL INFO Connected all trees\n"
        "gpu125:466534:466534 [6] NCCL INFO threadThresholds 8/8/64 | 128/8/64 | 512 | 512\n"
    )
    d = scan(tmp_path, know, text, engine="sglang")
    assert d.last_phase == "distributed_init"
    assert d.advice and all(c.param != "env:NCCL_DEBUG" for c in d.advice)


# --- shapes that hide the exception -------------------------------------------------------------


def test_a_bare_exception_line_is_an_error_line(tmp_path, know):
    """Python's last traceback line printed on its own (a launcher relaying its child's error)."""
    text = (
        "[2025-06-01 10:00:00 TP0] Capture cuda graph begin. This can take up to several minutes.\n"
        "Exception: Capture cuda graph failed: Failed: Assertion error /DeepEP/csrc/deep_ep.cpp:1030 "
        "'x.size(0) == topk_idx.size(0)'\n"
    )
    d = scan(tmp_path, know, text, engine="sglang")
    assert d.status == "failed"


def test_the_logger_exception_header_is_a_cut_tracebacks_message(tmp_path, know):
    """logger.exception("Error in preprocessing prompt inputs") (vllm/entrypoints/openai/
    serving_chat.py) right before a traceback cut before its exception line: the header is the
    evidence, and the engine's own template classes it."""
    loc = "ERROR 07-03 03:19:15 [serving_chat.py:200] "
    text = (
        f"{loc}Error in preprocessing prompt inputs\n"
        f"{loc}Traceback (most recent call last):\n"
        f'{loc}  File "/x/vllm/entrypoints/openai/serving_chat.py", line 183, in create_chat_completion\n'
        f"{loc}    ) = await self._preprocess_chat(\n"
    )
    d = scan(tmp_path, know, text, engine="vllm")
    assert d.primary.evidence == "Error in preprocessing prompt inputs"
    assert d.primary.cls == "request"


# --- wrappers that hide their cause -------------------------------------------------------------

SCHEDULER_TB = (
    "[2026-03-25 17:22:56] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/x/sglang/srt/managers/scheduler.py", line 1149, in event_loop_overlap\n'
    "    self.process_input_requests(recv_reqs)\n"
    '  File "/x/sglang/srt/managers/scheduler.py", line 1641, in handle_generate_request\n'
    "    added = self.grammar_manager.process_req_with_grammar(req)\n"
    '  File "/x/sglang/srt/constrained/base_grammar_backend.py", line 184, in get_cached_or_future_value\n'
    "    value = self.cache.get(key)\n"
    "{exc}\n"
)


def test_a_scheduler_that_died_of_a_requests_data_error_is_a_request_failure(tmp_path, know):
    """The wrapper ("Scheduler hit an exception") classed by the traceback of the process that
    died: a data error raised on the request-intake path is one request's input."""
    d = scan(tmp_path, know, SCHEDULER_TB.format(exc="TypeError: unhashable type: 'dict'"), engine="sglang")
    assert d.status == "failed" and d.primary.cls == "request"
    assert d.primary.evidence.startswith("TypeError") and first(d) == "engine_version"


def test_a_wrapper_whose_traceback_a_rule_explains_keeps_that_rules_finding(tmp_path, know):
    d = scan(
        tmp_path, know, SCHEDULER_TB.format(exc="RuntimeError: CUDA error: out of memory"), engine="sglang"
    )
    assert d.primary.cls == "oom"


def test_the_tgi_router_losing_its_shard_is_a_failure(tmp_path, know):
    """backends/v3/src/client: the router cannot reach the shard's socket any more."""
    text = (
        "2024-09-23T12:10:00.000000Z  INFO text_generation_router::server: router/src/server.rs:1: Connected\n"
        "2024-09-23T12:11:41.494757Z ERROR batch{batch_size=1}:prefill: text_generation_router_v3::client: "
        "backends/v3/src/client/mod.rs:54: Server error: error trying to connect: No such file or directory (os error 2)\n"
    )
    d = scan(tmp_path, know, text, engine="tgi")
    assert d.status == "failed"


# --- the engine's own numbers ------------------------------------------------------------------


def test_a_negative_kv_capacity_shrinks_the_weights_per_gpu_first(tmp_path, know):
    """SGLang's model_runner.py falls back to the profiled pool, negative when the weights left
    less than nothing: no context length fits, so max_model_len is not the change."""
    text = (
        "[2025-07-02 07:41:58 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
        "avail mem=21.73 GB, mem usage=166.59 GB.\n"
        "[2025-07-02 07:41:59 TP0] max_total_tokens=131072 is larger than the profiled value -561981. "
        "Use the profiled value instead.\n"
    )
    d = scan(tmp_path, know, text, engine="sglang")
    assert d.primary.cls == "kv_cache_too_small" and d.primary.facts["kv_tokens"] == -561981
    assert all(c.param != "max_model_len" for c in d.advice)
    assert first(d) in ("tensor_parallel_size", "quantization")


@pytest.mark.parametrize(
    ("procs", "cls"),
    [
        # another process holds 71 of 79 GiB
        (
            " Process 3888866 has 71.11 GiB memory in use. Including non-PyTorch memory, this "
            "process has 8.06 GiB memory in use.",
            "gpu_busy",
        ),
        # this process holds nearly all of it: its own OOM
        (
            " Process 12 has 0.50 GiB memory in use. Including non-PyTorch memory, this process "
            "has 78.60 GiB memory in use.",
            "oom",
        ),
        # NVML's host PIDs in a container: this process is not named, the largest entry may be it
        (
            " Process 450 has 30.10 GiB memory in use. Process 451 has 30.00 GiB memory in use. "
            "Process 452 has 18.00 GiB memory in use.",
            "gpu_busy",
        ),
        (" Process 450 has 7.69 GiB memory in use. Process 451 has 70.10 GiB memory in use.", "oom"),
        (" Process 450 has 78.69 GiB memory in use.", "oom"),
    ],
)
def test_the_allocators_process_list_says_whose_memory_it_was(tmp_path, know, procs, cls):
    d = scan(tmp_path, know, TORCH_OOM.format(procs=procs) + "\n")
    assert d.primary.cls == cls


def test_a_cut_that_would_starve_the_reported_kv_cache_is_not_proposed(tmp_path, know):
    """vLLM 0.19 printed the graphs' estimate and the KV cache it sized: a 5 % utilisation cut
    cannot free 4.79 GiB from a cache with 0.28 GiB beyond one 4,096-token request."""
    p = "(EngineCore pid=1) INFO 05-02 13:35:0{s} [{f}] "
    text = (
        "INFO 05-02 13:34:14 [utils.py:233] non-default args: {'max_model_len': 4096, "
        "'gpu_memory_utilization': 0.8, 'model': 'm'}\n"
        + p.format(s=4, f="gpu_model_runner.py:5955")
        + "Estimated CUDA graph memory: 4.79 GiB total\n"
        + p.format(s=5, f="gpu_worker.py:436")
        + "Available KV cache memory: 0.85 GiB\n"
        + p.format(s=5, f="kv_cache_utils.py:1319")
        + "GPU KV cache size: 6,144 tokens\n"
        + p.format(s=6, f="gpu_model_runner.py:1")
        + "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 0%\n"
        "(EngineCore pid=1) ERROR 05-02 13:35:28 [core.py:1108] torch.OutOfMemoryError: CUDA out of "
        "memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 23.56 GiB of which 9.06 MiB is free.\n"
    )
    d = scan(tmp_path, know, text, engine="vllm")
    assert d.primary.oom_phase == "startup"
    assert first(d) == "enforce_eager" and all(c.param != "gpu_memory_utilization" for c in d.advice)


def test_a_runtime_oom_with_nothing_running_is_the_pool_not_the_batch(tmp_path, know):
    """A wake-up re-mapping the pool (cumem_allocator) while no request runs: fewer or shorter
    requests cannot help."""
    text = (
        "INFO 06-02 14:00:00 [api_server.py:1] vLLM API server version 0.22.0\n"
        "(APIServer pid=1) INFO:     Application startup complete.\n"
        '(APIServer pid=1) INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 200 OK\n'
        "(APIServer pid=1) INFO 06-02 14:30:00 [loggers.py:127] Engine 000: Avg prompt throughput: 0.0 "
        "tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV "
        "cache usage: 0.0%, Prefix cache hit rate: 0.0%\n"
        "(EngineCore pid=2) ERROR 06-02 14:31:00 [cumem.py:1] torch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.00 GiB is free.\n"
    )
    d = scan(tmp_path, know, text, engine="vllm")
    assert d.primary.oom_phase == "runtime"
    params = [c.param for c in d.advice]
    assert params[0] == "gpu_memory_utilization" and "action:free_gpu" in params
    assert not {"max_num_batched_tokens", "max_num_seqs"} & set(params)


# --- the first change, keyed by the sub-cause the message names ----------------------------------


@pytest.mark.parametrize(
    ("line", "want"),
    [
        # torch.utils.cpp_extension / FlashInfer's JIT without the CUDA toolkit
        (
            "RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist",
            "env:CUDA_HOME",
        ),
        # cudaGetErrorString(cudaErrorInvalidKernelImage), through Triton
        ("RuntimeError: Triton Error [CUDA]: device kernel image is invalid", "engine_version"),
        # cudaErrorNoKernelImageForDevice
        (
            "RuntimeError: CUDA error: no kernel image is available for execution on the device",
            "engine_version",
        ),
        # the dynamic loader
        (
            "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory",
            "action:reinstall",
        ),
        # cudaErrorNoDevice
        ("RuntimeError: CUDA error: no CUDA-capable device is detected", "action:expose_gpu"),
    ],
)
def test_driver_advice_follows_what_the_message_names(tmp_path, know, line, want):
    d = scan(tmp_path, know, line + "\n")
    assert d.primary.cls == "driver" and first(d) == want


def test_an_unknown_architecture_asks_for_a_newer_engine_first(tmp_path, know):
    """llama.cpp's loader (src/llama-model.cpp) relayed by Ollama: an architecture this build does
    not know is not a corrupt file."""
    line = (
        "Error: llama runner process has terminated: signal: abort trap error:error loading model "
        "architecture: unknown model architecture: 'gemma2'\n"
    )
    d = scan(tmp_path, know, line, engine="ollama")
    assert d.primary.cls == "weights_format" and first(d) == "engine_version"


def test_a_malformed_subcause_is_named_with_its_file_and_field(tmp_path):
    from pathlib import Path

    import yaml

    from diagnose.advice.data import advice_data
    from diagnose.base.data_files import builtin_rules_dir
    from diagnose.base.errors import RuleError

    data = yaml.safe_load(Path(builtin_rules_dir(), "advice", "advice.yaml").read_text())
    data["subcauses"].append(
        {"class": "driver", "name": "x", "pattern": "(", "changes": ["action:reinstall"]}
    )
    bad = tmp_path / "advice.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(RuleError, match=r"subcauses\[\d+\]\.pattern"):
        advice_data(str(bad))


# --- false alarms -------------------------------------------------------------------------------


def test_a_failure_the_server_got_past_before_ready_degrades_nothing(tmp_path, know):
    """transformers' "does not appear to have a file named generation_config.json" before the
    server came up: noted, not a degraded server, nothing to change."""
    text = (
        "[2025-06-01 10:00:00] server_args=ServerArgs(model_path='m')\n"
        "[2025-06-01 10:00:01] OSError: m does not appear to have a file named generation_config.json.\n"
        "[2025-06-01 10:00:30] INFO:     Application startup complete.\n"
        "[2025-06-01 10:00:31] The server is fired up and ready to roll!\n"
    )
    d = scan(tmp_path, know, text, engine="sglang")
    assert d.status == "ready" and d.advice == []


# --- errors while serving ----------------------------------------------------------------------


def test_a_refused_request_is_a_request_finding_on_a_server_that_stays_up(tmp_path, know):
    """vLLM's serving_chat.py logs the ErrorResponse it returns ("Error with model …"): the class
    is request, the server stays ready, and the change is the request's, keyed by what the
    message names."""
    text = (
        "INFO 05-12 02:40:00 [api_server.py:1] vLLM API server version 0.8.5\n"
        "INFO:     Application startup complete.\n"
        "ERROR 05-12 02:47:14 [serving_chat.py:136] Error with model object='error' message='The model "
        "`deepseek-r1-14b` does not exist.' type='NotFoundError' param=None code=404\n"
        'INFO:     127.0.0.1:56148 - "POST /v1/chat/completions HTTP/1.1" 404 Not Found\n'
    )
    d = scan(tmp_path, know, text, engine="vllm")
    assert d.status == "ready" and d.primary.cls == "request"
    assert d.primary.facts["status"] == 404
    assert first(d) == "model" and "served" in d.advice[0].to


# --- what the server did versus what it planned ---------------------------------------------------


@pytest.mark.parametrize(
    ("plan", "engine"),
    [
        (
            "$ ./build/bin/llama-server -m models/qwen2.5-3b-q4_k_m.gguf -c 8192 -ngl 99 --port 8080\n",
            "llamacpp",
        ),
        (
            'time=2025-01-16T04:29:50.909Z level=INFO source=memory.go:356 msg="offload to cuda" '
            'layers.requested=-1 layers.model=33 layers.offload=33 layers.split=""\n',
            "ollama",
        ),
    ],
)
def test_layers_planned_on_the_gpu_that_ran_on_the_cpu_are_a_driver_failure(tmp_path, know, plan, engine):
    """llama.cpp's load_tensors says how many layers it offloaded: none, against a plan of many,
    is a silent CPU fallback (a CPU-only build, or no device it could use)."""
    text = plan + "load_tensors: offloaded 0/33 layers to GPU\n"
    d = scan(tmp_path, know, text, engine=engine)
    assert d.primary.rule == "consistency.cpu-fallback" and d.primary.cls == "driver"
    assert d.status == "degraded" and first(d) == "action:expose_gpu"


def test_layers_that_did_go_to_the_gpu_are_no_fallback(tmp_path, know):
    text = (
        "$ ./build/bin/llama-server -m m.gguf -c 8192 -ngl 99 --port 8080\n"
        "load_tensors: offloaded 33/33 layers to GPU\n"
    )
    d = scan(tmp_path, know, text, engine="llamacpp")
    assert all(f.rule != "consistency.cpu-fallback" for f in d.findings)


# --- runtime libraries' own error strings ------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "cls"),
    [
        # cudaGetErrorString(cudaErrorDevicesUnavailable): exclusive-process mode, another holder
        ("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable", "gpu_busy"),
        # cudaErrorECCUncorrectable
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "driver"),
        # cudaErrorIllegalAddress: a kernel fault
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "driver"),
        # cuBLAS's handle without memory for its workspace
        (
            "RuntimeError: CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
            "oom",
        ),
        # glibc's loader
        (
            "ImportError: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found "
            "(required by /venv/lib/python3.10/site-packages/vllm/_C.abi3.so)",
            "driver",
        ),
        # CANN (torch_npu's guide): HCCL's notify wait timeout, an invalid device id
        (
            "EI0002: [PID: 7277] 2024-11-28-11:59:30.645.648 The wait execution of the Notify register "
            "times out. Reason: The Notify register has not received the Notify record from remote rank [unknown].",
            "nccl",
        ),
        (
            "EE1001: [PID: 2228607] 2025-08-06-16:15:27.377.593 The argument is invalid.Reason: Set device "
            "failed, invalid device, set drv device=100, valid device range is [0, 8)",
            "tp_mismatch",
        ),
    ],
)
def test_the_runtime_libraries_own_strings_are_classed_whatever_the_engine(tmp_path, know, line, cls):
    d = scan(tmp_path, know, line + "\n")
    assert d.status == "failed" and d.primary.cls == cls


# --- advice that was one log's fix, now the message family's ------------------------------------


@pytest.mark.parametrize(
    ("raised", "proxy"),
    [
        ("AssertionError: res=<Response [502]>, res.text=''", True),
        ("RuntimeError: CUDA error: unspecified", False),
    ],
)
def test_a_warmup_failure_gets_no_proxy_only_when_its_traceback_says_a_gateway_answered(
    tmp_path, know, raised, proxy
):
    """SGLang's "Initialization failed. warmup error" wraps whatever the warm-up met: NO_PROXY is
    the fix only when the traceback's own exception shows a gateway status on the local request."""
    text = (
        "[2024-12-13 01:47:34] Initialization failed. warmup error: Traceback (most recent call last):\n"
        '  File "/x/sglang/srt/server.py", line 540, in _wait_and_warmup\n'
        '    assert res.status_code == 200, f"{res=}, {res.text=}"\n'
        f"{raised}\n"
    )
    d = scan(tmp_path, know, text, engine="sglang")
    assert any(c.param == "env:NO_PROXY" for c in d.advice) is proxy
