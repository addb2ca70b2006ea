"""What a new user meets first: a distribution name of our own, `--version`, a licence, the
README's commands with `python3`; output a console that cannot print ✓ still prints; several
logs' JSON keeps its positions when one cannot be read; Markdown meant for a public thread
names no local path; a shipped starter incident is said as a known family, not as seen here;
an impossible figure is flagged; durations come from the log's own timestamps."""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib

from diagnose import __version__

from .conftest import FIXTURES, REAL_LOGS, ROOT, run

KV_LOG = FIXTURES / "logs" / "vllm" / "kv-cache-too-small-v1.log"
HEALTHY = FIXTURES / "logs" / "vllm" / "healthy-v1-serving.log"


def test_a_name_of_our_own_a_version_and_a_licence(cli) -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["name"] == "diagnose-llm" and meta["license"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    r = run([*cli, "--version"])
    assert r.returncode == 0 and r.stdout.decode().startswith(f"diagnose-llm {__version__} (python ")
    doc = json.loads(run([*cli, "--version", "--json"]).stdout)
    assert doc["name"] == "diagnose-llm" and doc["version"] == __version__
    scan = json.loads(run([*cli, "scan", "--json", str(KV_LOG)]).stdout)
    assert scan["diagnose_version"] == __version__
    readme = (ROOT / "README.md").read_text()
    first = [line for line in readme.splitlines()[:8] if "venv" in line]
    assert len(first) == 2 and all(line.startswith("python3 -m venv ") for line in first)
    assert "pip install 'diagnose[" not in readme and "python3.11" not in readme


def test_a_console_that_cannot_print_the_symbols_gets_ascii(cli) -> None:
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    r = run([*cli, "scan", str(KV_LOG)], env=env)
    out = r.stdout.decode("ascii")  # all of it ASCII
    assert r.returncode == 1 and out.startswith("X failed: ") and b"Traceback" not in r.stderr
    r = run(
        [
            *cli,
            "plan",
            "--config",
            str(FIXTURES / "configs" / "meta-llama-Meta-Llama-3.1-8B.json"),
            "--gpus",
            "1x24",
        ],
        env=env,
    )
    assert r.returncode == 0 and r.stdout.decode("ascii").startswith("OK fits with --max-model-len")


def test_several_logs_keep_their_positions_when_one_cannot_be_read(cli) -> None:
    r = run([*cli, "scan", "--json", str(KV_LOG), "/nonexistent/serve.log", str(HEALTHY)])
    doc = json.loads(r.stdout)
    assert [(x["source"], x["status"]) for x in doc] == [
        (str(KV_LOG), "failed"),
        ("/nonexistent/serve.log", "error"),
        (str(HEALTHY), "ready"),
    ]
    assert "no such file" in doc[1]["error"] and r.stderr.count(b"\n") == 1


def test_markdown_for_a_public_thread_names_no_local_path(cli, tmp_path) -> None:
    log = tmp_path / "serve.log"
    log.write_bytes(KV_LOG.read_bytes())
    import subprocess

    out = subprocess.run(
        [*cli, "scan", "--format", "markdown", str(log)], capture_output=True, cwd=ROOT, timeout=60
    ).stdout.decode()
    assert str(tmp_path) not in out and "`serve.log:32`" in out


def test_a_starter_incident_is_a_known_family_not_seen_here(cli) -> None:
    out = run([*cli, "scan", str(KV_LOG)]).stdout.decode()
    assert "known family KB-9" in out and "seen before" not in out
    md = run([*cli, "scan", "--format", "markdown", str(KV_LOG)]).stdout.decode()
    assert "**Known family** (shipped starter incident)" in md and "Seen before" not in md


def test_an_impossible_figure_is_flagged() -> None:
    from diagnose.model.typed_facts import impossible_facts

    facts = {"tried_gib": 0.2539, "total_gib": 6.0, "free_gib": 0.0, "process_gib": 17179869184.0}
    assert impossible_facts(facts) == {"process_gib"}
    assert impossible_facts({"total_gib": 80.0, "process_gib": 79.0}) == set()


def test_an_impossible_figure_in_a_real_log_is_not_stated_as_fact(cli) -> None:
    log = REAL_LOGS / "vllm-208-oom-load-qwen25-7b-fp16-on-6gb-wsl-v0160" / "log.txt"
    if not log.is_file():
        import pytest

        pytest.skip("../shared/real-logs is absent")
    out = run([*cli, "scan", str(log)]).stdout.decode()
    assert "process 17179869184.0 GiB (impossible: the driver misreports it)" in out


def test_startup_and_phase_durations_by_the_logs_own_clock(cli) -> None:
    doc = json.loads(run([*cli, "scan", "--json", str(HEALTHY)]).stdout)
    d = doc["durations"]
    assert d["clock"] == "log" and d["startup_s"] == 60.0
    assert sum(p["s"] for p in d["phases"]) == d["elapsed_s"]
    text = run([*cli, "scan", str(HEALTHY)]).stdout.decode()
    assert re.search(r"took\s+ready in 1 min 00 s by the log's timestamps", text)
    md = run([*cli, "scan", "--format", "markdown", str(HEALTHY)]).stdout.decode()
    assert "**Startup:** ready in 1 min 00 s" in md
    assert sys.version_info >= (3, 11)


def test_help_names_every_engine_and_shows_an_example_per_command(cli) -> None:
    root = run([*cli, "--help"], env={"COLUMNS": "200"}).stdout.decode()
    for engine in ("vLLM", "SGLang", "TGI", "Ollama", "llama.cpp", "LMDeploy", "TensorRT-LLM"):
        assert engine in root, engine
    commands = ["scan", "device", "stream", "k8s", "watch", "run", "probe", "plan", "check"]
    commands += ["rules list", "rules show", "rules test", "kb add", "kb list", "kb show", "kb search"]
    for command in commands:
        out = run([*cli, *command.split(), "--help"], env={"COLUMNS": "200"}).stdout.decode()
        assert "Example: " in out, command
        assert f"diagnose {command}" in " ".join(out.split("Example: ", 1)[1].split()), command
    for command in ("run", "check"):
        out = run([*cli, command, "--help"], env={"COLUMNS": "200"}).stdout.decode()
        assert f"Usage: diagnose {command} [OPTIONS] -- COMMAND [ARGS]..." in out


def test_a_streams_ready_event_carries_the_logs_own_durations(cli) -> None:
    out = run([*cli, "stream", "--events", "ready,closed", str(HEALTHY)]).stdout.decode().splitlines()
    ready, closed = (json.loads(x) for x in out)
    assert ready["event"] == "ready" and ready["durations"]["startup_s"] == 60.0
    assert closed["durations"]["clock"] == "log"
