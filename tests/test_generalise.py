"""Diagnosis beyond the specific rules: restart loops, several files, stops, the vocabulary
layer and OOM phases from context. Logs are built from real line formats (fixtures and the
engines' catalogued messages)."""

from __future__ import annotations

import json

import pytest

from .conftest import FIXTURES, SHARED, profile_oom, run

OOM_LOAD_LOG = FIXTURES / "logs" / "vllm" / "oom-load-v1-tp2.log"
HEALTHY_LOG = FIXTURES / "logs" / "vllm" / "healthy-v1-serving.log"


def _scan(know, tmp_path, text: str, name: str = "serve.log"):  # type: ignore[no-untyped-def]
    from diagnose.pipeline.scan import scan_paths

    p = tmp_path / name
    p.write_text(text)
    return scan_paths([str(p)], know)


def test_restart_loop_is_judged_on_the_latest_run(know, tmp_path):
    """40 failing starts (systemd / CrashLoopBackOff): failed, not 'degraded from an earlier run'."""
    d = _scan(know, tmp_path, OOM_LOAD_LOG.read_text() * 40)
    assert d.status == "failed"
    assert d.primary is not None and d.primary.cls == "oom" and d.primary.oom_phase == "load"
    assert d.primary.facts["runs"] == 40 and d.primary.facts["runs_failed_alike"] == 40
    assert "40 of 40 runs" in (d.primary.note or "")
    # the earlier runs are summarised, not listed one by one
    assert len([f for f in d.findings if f.cls == "oom"]) == 1


def test_restart_loop_then_success_is_ready(know, tmp_path):
    d = _scan(know, tmp_path, OOM_LOAD_LOG.read_text() * 5 + HEALTHY_LOG.read_text())
    assert d.status in ("ready", "degraded")
    assert d.primary is None or d.primary.severity == "warning"


def test_several_files_are_several_diagnoses(cli, tmp_path):
    bad = tmp_path / "bad.log"
    bad.write_bytes(OOM_LOAD_LOG.read_bytes())
    good = tmp_path / "good.log"
    good.write_bytes(HEALTHY_LOG.read_bytes())
    p = run([*cli, "scan", "--json", str(good), str(tmp_path / "missing.log"), str(bad)])
    out = json.loads(p.stdout)
    # positions follow the arguments: the unreadable file keeps its place as an error object
    assert [o["source"] for o in out] == [str(good), str(tmp_path / "missing.log"), str(bad)]
    assert [o["status"] for o in out] == ["ready", "error", "failed"]
    assert all(o["schema"] == 1 for o in out)
    assert p.returncode == 1  # one failed
    assert b"missing.log: no such file" in p.stderr and b"Traceback" not in p.stderr
    # text: one report each
    p = run([*cli, "scan", str(good), str(bad)])
    text = p.stdout.decode()
    assert text.count("engine vllm") == 2 and "✓ ready" in text and "✗ failed" in text


def test_only_unreadable_files_exit_2(cli, tmp_path):
    good = tmp_path / "good.log"
    good.write_bytes(HEALTHY_LOG.read_bytes())
    p = run([*cli, "scan", str(good), str(tmp_path / "nope.log")])
    assert p.returncode == 2 and b"nope.log: no such file" in p.stderr and b"ready" in p.stdout


def test_merge_interleaves_the_logs_of_one_run_by_time(know, tmp_path):
    """Two ranks' logs: rank 1 runs out of memory at 10:00:05, rank 0 reports NCCL trouble at
    10:00:07. Merged, the memory failure comes first and the NCCL error is its consequence."""
    from diagnose.pipeline.scan import scan_paths

    r0 = tmp_path / "rank0.log"
    r1 = tmp_path / "rank1.log"
    r0.write_text(
        "2025-05-16T10:00:00Z INFO 05-16 10:00:00 [gpu_model_runner.py:1] Starting to load model x...\n"
        "2025-05-16T10:00:07Z ERROR 05-16 10:00:07 [core.py:1] torch.distributed.DistBackendError: "
        "NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error\n"
    )
    r1.write_text(
        "2025-05-16T10:00:01Z INFO 05-16 10:00:01 [gpu_model_runner.py:1] Starting to load model x...\n"
        "2025-05-16T10:00:05Z ERROR 05-16 10:00:05 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 896.00 MiB. GPU 1 has a total capacity of 79.19 GiB of which 120.00 MiB is free.\n"
    )
    d = scan_paths([str(r0), str(r1)], know)
    assert d.primary is not None and d.primary.cls == "oom" and d.primary.source == str(r1)
    assert d.primary.line == 2  # each file keeps its own line numbers
    nccl = [f for f in d.findings if f.cls == "nccl"]
    assert nccl and nccl[0].consequence and nccl[0].source == str(r0)


def test_sigterm_after_ready_is_a_stop(know, tmp_path):
    """vLLM V1's own shutdown after SIGTERM, with the EngineDeadError its API server prints."""
    tail = (
        "(EngineCore pid=23397) INFO 08-01 21:34:51 [core.py:1214] [shutdown] EngineCore: trigger received signal=SIGTERM\n"
        "(APIServer pid=23283) ERROR 08-01 21:34:51 [async_llm.py:704] AsyncLLM output_handler failed.\n"
        "(APIServer pid=23283) ERROR 08-01 21:34:51 [async_llm.py:704] Traceback (most recent call last):\n"
        '(APIServer pid=23283) ERROR 08-01 21:34:51 [async_llm.py:704]   File "/x/vllm/v1/engine/async_llm.py", line 660, in output_handler\n'
        "(APIServer pid=23283) ERROR 08-01 21:34:51 [async_llm.py:704]     outputs = await engine_core.get_output_async()\n"
        "(APIServer pid=23283) ERROR 08-01 21:34:51 [async_llm.py:704] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue. See stack trace (above) for the root cause.\n"
        "(APIServer pid=23283) INFO:     Shutting down\n"
    )
    d = _scan(know, tmp_path, HEALTHY_LOG.read_text() + tail)
    assert d.status == "ready" and d.primary is None and d.advice == []
    stops = [f for f in d.findings if f.cls == "stop"]
    assert stops and stops[0].severity == "info"
    assert all(f.severity == "info" for f in d.findings)


def test_ctrl_c_before_ready_is_incomplete(know, tmp_path):
    log = (
        "INFO 05-26 18:53:37 [api_server.py:1043] vLLM API server version 0.8.5.post1\n"
        "INFO 05-26 18:53:37 [api_server.py:1044] args: Namespace(model_tag='Qwen/Qwen2.5-7B', port=8000)\n"
        "Traceback (most recent call last):\n"
        '  File "/x/huggingface_hub/hf_api.py", line 3830, in list_repo_tree\n'
        "    for path_info in paginate(path=tree_url, headers=headers, params={}):\n"
        "KeyboardInterrupt\n"
    )
    d = _scan(know, tmp_path, log)
    assert d.status == "incomplete" and d.primary is None and d.last_phase == "args"


def test_error_before_the_stop_is_still_the_failure(know, tmp_path):
    log = (
        "INFO 05-26 18:53:37 [api_server.py:1043] vLLM API server version 0.8.5.post1\n"
        "ERROR 05-26 18:54:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 0 has a total capacity of 23.56 GiB of which 21.75 MiB is free.\n"
        "KeyboardInterrupt\n"
    )
    d = _scan(know, tmp_path, log)
    assert d.status == "failed" and d.primary is not None and d.primary.cls == "oom"


def test_another_process_holding_the_port_is_not_a_stop(know, tmp_path):
    line = (
        "(APIServer pid=17544) WARNING 09-29 01:41:06 [launcher.py:98] port 8001 is used by process "
        "psutil.Process(pid=4242, name='python', status='running') launched with command:\n"
    )
    d = _scan(know, tmp_path, HEALTHY_LOG.read_text() + line)
    assert any(f.cls == "port_in_use" and f.severity == "warning" for f in d.findings)


def test_vocabulary_names_an_unexplained_exception(know, tmp_path):
    """No rule knows "CUDA_ERROR_NOT_INITIALIZED": the driver vocabulary names it, and says so."""
    log = (
        "(EngineCore pid=2391) ERROR 09-10 12:22:13 [core.py:1346] EngineCore failed to start.\n"
        "(EngineCore pid=2391) ERROR 09-10 12:22:13 [core.py:1346] Traceback (most recent call last):\n"
        '(EngineCore pid=2391) ERROR 09-10 12:22:13 [core.py:1346]   File "/x/vllm/v1/worker/gpu/model_runner.py", line 9, in __init__\n'
        '(EngineCore pid=2391) ERROR 09-10 12:22:13 [core.py:1346]     raise RuntimeError(f"cuInit failed: {err}")\n'
        "(EngineCore pid=2391) ERROR 09-10 12:22:13 [core.py:1346] RuntimeError: cuInit failed: CUDA_ERROR_NOT_INITIALIZED\n"
    )
    d = _scan(know, tmp_path, log)
    p = d.primary
    assert p is not None and p.cls == "driver" and p.rule == "vocabulary.driver"
    assert p.confidence == "low" and "vocabulary" in (p.note or "")
    assert p.evidence == "RuntimeError: cuInit failed: CUDA_ERROR_NOT_INITIALIZED" and p.line == 5
    assert json.loads(json.dumps(p.to_json()))["confidence"] == "low"


def test_vocabulary_reads_the_lines_after_a_multiline_message(know, tmp_path):
    log = (
        "Traceback (most recent call last):\n"
        '  File "/x/torch/utils/cpp_extension.py", line 2522, in _run_ninja_build\n'
        "    raise RuntimeError(message) from e\n"
        "RuntimeError: Error building extension 'sampling':\n"
        "  [1/4] /usr/local/cuda/bin/nvcc ... -c sampling.cu -o sampling.cuda.o\n"
        "  FAILED: sampling.cuda.o\n"
        "  /bin/sh: 1: /usr/local/cuda/bin/nvcc: not found\n"
    )
    d = _scan(know, tmp_path, log)
    assert d.primary is not None and d.primary.cls == "driver"


def test_code_echoed_by_a_frame_is_not_vocabulary(know, tmp_path):
    """A frame's source line says 'out of memory' in a condition; the exception is a KeyError."""
    log = (
        "Traceback (most recent call last):\n"
        '  File "/x/engine.py", line 10, in step\n'
        '    if "out of memory" in str(e): retry()\n'
        "KeyError: 'request_id'\n"
    )
    d = _scan(know, tmp_path, log)
    assert d.primary is not None and d.primary.cls == "unknown_error"


def test_info_lines_do_not_feed_the_vocabulary(know, tmp_path):
    log = (
        "[2025-01-23 19:35:20] server_args=ServerArgs(model_path='x', tokenizer_path='x', trust_remote_code=False)\n"
        "[2025-01-23 19:35:21] Traceback (most recent call last):\n"
        '  File "/x/scheduler.py", line 1, in run\n'
        "ZeroDivisionError: division by zero\n"
    )
    d = _scan(know, tmp_path, log)
    assert d.primary is not None and d.primary.cls == "unknown_error"


def test_oom_with_no_timeline_then_http_shutdown_is_runtime(know, tmp_path):
    log = (
        '(EngineCore pid=103)   File "/x/vllm/model_executor/layers/fla/ops/chunk_o.py", line 161, in chunk_fwd_o\n'
        "(EngineCore pid=103)     o = torch.empty_like(v)\n"
        "(EngineCore pid=103) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a "
        "total capacity of 23.56 GiB of which 18.88 MiB is free.\n"
        "(APIServer pid=1) INFO:     Shutting down\n"
        "(APIServer pid=1) INFO:     Waiting for application shutdown.\n"
        "(APIServer pid=1) INFO:     Application shutdown complete.\n"
    )
    d = _scan(know, tmp_path, log)
    p = d.primary
    assert p is not None and p.oom_phase == "runtime" and p.phase_inferred == "context"
    assert "shut down" in (p.phase_evidence or "")


def test_oom_phase_from_the_stack_names_the_frame(know, tmp_path):
    log = (
        "Traceback (most recent call last):\n"
        '  File "/x/vllm/worker/worker.py", line 1, in determine_num_available_blocks\n'
        "    self.model_runner.profile_run()\n"
        '  File "/x/vllm/worker/model_runner.py", line 1, in profile_run\n'
        "    self.execute_model(model_input, kv_caches, intermediate_tensors)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "23.56 GiB of which 21.75 MiB is free.\n"
    )
    d = _scan(know, tmp_path, log)
    p = d.primary
    assert p is not None and p.oom_phase == "startup" and p.phase_inferred == "stack"
    assert p.phase_evidence == "the stack: frame determine_num_available_blocks"


def test_a_startup_that_ends_on_an_unexplained_error_line_failed_there(know, tmp_path):  # type: ignore[no-untyped-def]
    text = (
        "INFO 06-01 10:00:00 [api_server.py:1] vLLM API server version 0.10.1.1\n"
        "INFO 06-01 10:00:01 [utils.py:1] non-default args: {'model': 'Qwen/Qwen2.5-7B-Instruct', "
        "'max_model_len': 32768, 'max_loras': 3, 'max_num_seqs': 1}\n"
        "(EngineCore pid=100) ERROR 06-01 10:00:02 [core.py:1] max_loras (3) must be less than or "
        "equal to max_num_seqs (1).\n"
    )
    d = _scan(know, tmp_path, text)
    assert d.status == "failed" and d.primary.cls == "unknown_error"
    assert "max_loras (3)" in d.primary.evidence
    assert d.primary.title == "The startup ends on an error no rule explains"


def test_an_error_line_the_startup_went_past_is_not_its_failure(know, tmp_path):  # type: ignore[no-untyped-def]
    text = (
        "INFO 06-01 10:00:00 [api_server.py:1] vLLM API server version 0.10.1.1\n"
        "(EngineCore pid=100) ERROR 06-01 10:00:02 [core.py:1] could not reach the metrics collector\n"
        + "".join(
            f"INFO 06-01 10:00:{3 + i:02d} [default_loader.py:1] Loading weights shard {i}\n"
            for i in range(8)
        )
    )
    d = _scan(know, tmp_path, text)
    assert d.status == "incomplete" and d.primary is None


def test_a_rule_on_the_code_a_frame_echoes_yields_to_the_exception_line(know, tmp_path):
    """`raise RuntimeError("UVA is not available")` is the code; the line after it is what
    happened: the finding's evidence is the exception line, counted once. A traceback cut
    before its exception line keeps the code line as evidence."""
    head = (
        "(EngineCore pid=2391) ERROR 09-10 12:22:13 [core.py:1346] Traceback (most recent call last):\n"
        '(EngineCore pid=2391) ERROR 09-10 12:22:13 [core.py:1346]   File "/x/vllm/v1/worker/gpu/model_runner.py", line 9, in __init__\n'
        '(EngineCore pid=2391) ERROR 09-10 12:22:13 [core.py:1346]     raise RuntimeError("UVA is not available")\n'
    )
    d = _scan(
        know,
        tmp_path,
        head
        + "(EngineCore pid=2391) ERROR 09-10 12:22:13 [core.py:1346] RuntimeError: UVA is not available\n",
    )
    p = d.primary
    assert p is not None and p.rule == "vllm.driver.uva-unavailable"
    assert p.evidence == "RuntimeError: UVA is not available" and p.line == 4 and p.count == 1
    assert d.advice[0].param == "env:VLLM_USE_V2_MODEL_RUNNER" and d.advice[0].to == "0"
    cut = _scan(know, tmp_path, head)
    assert (
        cut.primary is not None
        and cut.primary.rule == "vllm.driver.uva-unavailable"
        and cut.primary.line == 3
    )


@pytest.mark.skipif(not (SHARED / "real-logs").is_dir(), reason="../shared/real-logs is not here")
@pytest.mark.parametrize(
    "name",
    [
        "sglang-212-oom_runtime-llama3-8b-a10g-prefill-13k-tokens-concurrent",
        "sglang-211-oom_runtime-llama4-scout-4k-images-conc64-vision-encoder",
    ],
)
def test_the_tail_of_a_log_keeps_its_oom_phase_from_the_stack(name, know, tmp_path):  # type: ignore[no-untyped-def]
    """What users paste is often the last lines only: a traceback cut at its top, no timeline.
    SGLang's request path (0.1-0.2's forward_prefill_batch; images embedded for a request)
    still says runtime."""
    lines = (SHARED / "real-logs" / name / "log.txt").read_text(errors="replace").split("\n")
    d = _scan(know, tmp_path, "\n".join(lines[-40:]))
    assert d.primary.cls == "oom" and d.primary.oom_phase == "runtime"
    assert "the stack" in (d.primary.phase_evidence or "")


def test_a_windows_traceback_reads_like_a_linux_one(know, tmp_path):  # type: ignore[no-untyped-def]
    """Backslashed paths, CRLF: the engine from its package path, the frames' file stems."""
    log = profile_oom("C:\\Users\\me\\venv\\Lib\\site-packages", "\\", "\r\n")
    d = _scan(know, tmp_path, log)
    assert d.engine.name == "vllm" and d.primary.oom_phase == "startup"
    assert d.primary.frames == ["determine_num_available_blocks", "worker"]


@pytest.mark.skipif(not (SHARED / "real-logs").is_dir(), reason="../shared/real-logs is not here")
def test_advice_on_an_earlier_runs_failure_reads_that_runs_context(know):  # type: ignore[no-untyped-def]
    """ollama-403: the runner failed at num_ctx 131072, then was started again at 8192 and
    served. The failure's change halves the context it failed with, not the one that worked."""
    from diagnose.pipeline.scan import scan_paths

    d = scan_paths([str(SHARED / "real-logs" / "ollama-403-oom_startup-kv-alloc-131k-ctx" / "log.txt")], know)
    first = d.advice[0]
    assert first.param == "max_model_len" and (first.frm, first.to) == ("131072", "65536")
