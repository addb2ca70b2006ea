"""Engines are data: the engine list is the set of profiles, and a new engine needs a profile
and rules in YAML, no code. Also: every shipped profile detects its own lines and no other's."""

from __future__ import annotations

import json
import textwrap

import pytest

from .conftest import FIXTURES, run

NINTH_PROFILE = textwrap.dedent("""\
    engine: mistralrs
    title: mistral.rs server
    prefixes:
      - pattern: '<(?P<ts>\\d{2}:\\d{2}:\\d{2})\\|(?P<lv1>[IWE])\\|(?P<proc>\\w+)> '
        examples: ["<10:00:00|I|mistralrs_server> Model kind is: normal (no adapters)"]
    detect:
      - needles: ["mistralrs_server", "mistralrs_core"]
        pattern: 'mistralrs_(?:server|core)'
        weight: 10
        examples: ["<10:00:00|I|mistralrs_server> Model kind is: normal (no adapters)"]
    phases:
      - phase: args
        needles: ["Model kind is"]
        pattern: '^Model kind is: '
        examples: ["<10:00:00|I|mistralrs_server> Model kind is: normal (no adapters)"]
      - phase: load_weights
        needles: ["Loading `"]
        pattern: '^Loading `[^`]+`'
        examples: ["<10:00:01|I|mistralrs_core> Loading `model.safetensors`"]
      - phase: kv_cache
        needles: ["for PagedAttention KV cache"]
        pattern: '^Allocating \\d+ MB for PagedAttention KV cache'
        examples: ["<10:00:09|I|mistralrs_core> Allocating 8192 MB for PagedAttention KV cache"]
      - phase: ready
        needles: ["Serving on http"]
        pattern: '^Serving on http'
        examples: ["<10:00:12|I|mistralrs_server> Serving on http://0.0.0.0:1234."]
    launch:
      - kind: command_line
        needles: ["mistralrs-server"]
        pattern: '(?:^|/)mistralrs-server\\b'
        examples: ["mistralrs-server --port 1234 --max-seq-len 4096 plain -m mistralai/Mistral-7B-v0.1"]
    flags:
      gpu_memory_utilization: --pa-gpu-mem-usage
      max_model_len: --max-seq-len
      max_num_seqs: --max-seqs
      tensor_parallel_size: --num-device-layers
    names:
      pa_gpu_mem_usage: gpu_memory_utilization
      max_seq_len: max_model_len
      max_seqs: max_num_seqs
      m: model
    defaults:
      gpu_memory_utilization: 0.9
      max_num_seqs: 16
    memory:
      kv_budget: total
      launch: "mistralrs-server plain -m {model}"
    metrics:
      running: ["mistralrs_running_requests"]
      waiting: ["mistralrs_waiting_requests"]
      kv_usage: ["mistralrs_kv_cache_usage"]
    """)

NINTH_RULE = textwrap.dedent("""\
    - id: mistralrs.oom
      engines: [mistralrs]
      class: oom
      severity: fatal
      needles: ["CUDA_ERROR_OUT_OF_MEMORY"]
      pattern: '^DriverError\\(CUDA_ERROR_OUT_OF_MEMORY'
      title: The CUDA driver ran out of memory (mistral.rs)
      examples:
        match: ['<10:00:10|E|mistralrs_server> DriverError(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")']
        no_match: ["<10:00:09|I|mistralrs_core> Allocating 8192 MB for PagedAttention KV cache"]
    """)

# its own line layout, which no other profile knows: "<time|level|process> message"
NINTH_LOG = textwrap.dedent("""\
    <10:00:00|I|mistralrs_server> Model kind is: normal (no adapters)
    <10:00:01|I|mistralrs_core> Loading `model.safetensors`
    <10:00:09|I|mistralrs_core> Allocating 8192 MB for PagedAttention KV cache
    <10:00:10|E|mistralrs_server> DriverError(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")
    """)


@pytest.fixture()
def ninth(tmp_path):  # type: ignore[no-untyped-def]
    rules = tmp_path / "rules"
    (rules / "engines").mkdir(parents=True)
    (rules / "engines" / "mistralrs.yaml").write_text(NINTH_PROFILE)
    (rules / "mistralrs.yaml").write_text(NINTH_RULE)
    log = tmp_path / "serve.log"
    log.write_text(NINTH_LOG)
    return rules, log


def test_a_ninth_engine_is_one_profile_and_its_rules(cli, ninth):
    rules, log = ninth
    p = run([*cli, "scan", "--json", "--rules", str(rules), str(log)])
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    assert doc["engine"]["name"] == "mistralrs"
    assert [m["phase"] for m in doc["timeline"]] == ["args", "load_weights", "kv_cache"]
    assert doc["primary"]["rule"] == "mistralrs.oom" and doc["primary"]["oom_phase"] == "startup"
    # the profile's prefix split the line: the evidence is the message, the time is the log's
    assert doc["primary"]["evidence"].startswith("DriverError(") and doc["primary"]["time"] == "10:00:10"
    first = doc["advice"][0]
    assert first["param"] == "gpu_memory_utilization" and first["flag"] == "--pa-gpu-mem-usage"
    assert first["to"] == "0.85"
    # the engine list is the set of profiles: --engine accepts it, rules list and show know it
    p = run([*cli, "scan", "--engine", "mistralrs", "--rules", str(rules), str(log)])
    assert p.returncode == 1 and b"--pa-gpu-mem-usage 0.85" in p.stdout
    p = run([*cli, "rules", "list", "--rules", str(rules)])
    assert b"mistralrs" in p.stdout and b"mistral.rs server" in p.stdout
    p = run([*cli, "rules", "show", "mistralrs", "--rules", str(rules)])
    assert p.returncode == 0 and b"--pa-gpu-mem-usage" in p.stdout and b"mistralrs.oom" in p.stdout


def test_a_ninth_engine_plans_checks_and_sweeps_with_no_code(cli, ninth, tmp_path):
    """plan, check and probe --sweep of the ninth engine read only its profile (DIAGNOSE_RULES)."""
    import os

    from .batching_stub import BatchingStub

    rules, _log = ninth
    env = {**os.environ, "DIAGNOSE_RULES": str(rules), "NO_COLOR": "1"}
    config = FIXTURES / "configs" / "meta-llama-Meta-Llama-3.1-8B.json"
    p = run(
        [*cli, "plan", "--engine", "mistralrs", "--config", str(config), "--gpus", "1x80", "--json"], env=env
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["fits"] is True and doc["launch"].startswith("mistralrs-server plain -m")
    assert "--max-seq-len" in doc["launch"] or "--pa-gpu-mem-usage" in doc["launch"]
    model = tmp_path / "llama8b"
    model.mkdir()
    (model / "config.json").write_text(config.read_text())
    p = run(
        [
            *cli,
            "check",
            "--gpus",
            "1x24",
            "--json",
            "--",
            "mistralrs-server",
            "--max-seq-len",
            "131072",
            "plain",
            "-m",
            str(model),
        ],
        env=env,
    )
    doc = json.loads(p.stdout)
    assert doc["engine"] == "mistralrs" and p.returncode == 1, p.stderr
    changes = [pr["change"] for pr in doc["problems"] if pr["change"]]
    assert any(c["flag"] == "--max-seq-len" for c in changes), changes
    names = {
        "running": "mistralrs_running_requests",
        "waiting": "mistralrs_waiting_requests",
        "kv_usage": "mistralrs_kv_cache_usage",
    }
    with BatchingStub(slots=4, limit="kv", names=names) as stub:
        p = run([*cli, "probe", stub.url, "--sweep", "1,2,4,8", "--max-tokens", "16", "--json"], env=env)
    doc = json.loads(p.stdout)
    steps = doc["sweep"]["steps"]
    assert steps[-1]["metrics"]["running"] == 4 and steps[-1]["metrics"]["kv_usage"] > 0.5, steps[-1]


def test_a_rule_for_an_engine_with_no_profile_is_named(cli, tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "mine.yaml").write_text(NINTH_RULE)
    p = run([*cli, "rules", "list", "--rules", str(rules)])
    err = p.stderr.decode()
    assert "mine.yaml: rule mistralrs.oom: field 'engines': unknown engine 'mistralrs'" in err


def test_unknown_engine_is_a_usage_error_naming_the_known_ones(cli):
    p = run([*cli, "scan", "--engine", "nosuch", str(FIXTURES / "logs" / "vllm" / "healthy-v1-serving.log")])
    assert p.returncode == 2 and b"known: " in p.stderr and b"ollama" in p.stderr


SAMPLES = {
    "vllm": "INFO 05-26 18:53:37 [api_server.py:1043] vLLM API server version 0.8.5.post1",
    "sglang": "[2025-01-23 19:35:20] server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B-Instruct', tp_size=1)",
    "tgi": '2024-05-01T01:16:01.123456Z  INFO text_generation_launcher: Args { model_id: "x", num_shard: Some(1) }',
    "ollama": 'time=2025-02-03T10:11:12.345Z level=INFO source=routes.go:1238 msg="Listening on 127.0.0.1:11434 (version 0.5.7)"',
    "llamacpp": "main: server is listening on http://127.0.0.1:8080 - starting the main loop",
    "lmdeploy": "2024-07-30 10:00:00,123 - lmdeploy - INFO - async_engine.py:304 - input backend=turbomind, backend_config=TurbomindEngineConfig(tp=1)",
    "trtllm": "[07/08/2025-19:40:15] [TRT-LLM] [I] Use 27.54 GB for model weights.",
}


@pytest.mark.parametrize("engine", sorted(SAMPLES))
def test_each_profile_claims_its_own_lines(know, tmp_path, engine):
    from diagnose.pipeline.scan import scan_paths

    p = tmp_path / "x.log"
    p.write_text(SAMPLES[engine] + "\n")
    assert scan_paths([str(p)], know).engine.name == engine


def test_the_engines_are_the_profiles(know):
    assert know.engines == ["generic", "llamacpp", "lmdeploy", "ollama", "sglang", "tgi", "trtllm", "vllm"]


def test_a_user_profiles_backtracking_prefix_cannot_hang_a_scan(cli, tmp_path):
    """A user's line prefix runs on `regex` under the pattern timeout, as a user's rule does (#26)."""
    rules = tmp_path / "rules"
    (rules / "engines").mkdir(parents=True)
    (rules / "engines" / "slowpoke.yaml").write_text(
        textwrap.dedent("""\
        engine: slowpoke
        prefixes:
          - pattern: '(?:\\w+\\s?)+: '
            examples: ["abc def: the server says"]
        detect:
          - needles: ["slowpoke server"]
            pattern: 'slowpoke server'
            examples: ["slowpoke server starting"]
        """)
    )
    log = tmp_path / "serve.log"
    words = " ".join(["aaaa"] * 40)  # no colon: exponential for a backtracking engine
    log.write_text(f"{words}\nERROR {words}\nRuntimeError: CUDA error: out of memory\n")
    import time

    started = time.monotonic()
    p = run([*cli, "scan", "--json", "--rules", str(rules), str(log)])
    assert p.returncode == 1, p.stderr
    assert json.loads(p.stdout)["primary"]["class"] == "oom"
    assert time.monotonic() - started < 20  # three timeouts of 0.25 s at most, then not tried again
