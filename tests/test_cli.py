"""The installed console script, run as users run it: files, pipes, formats, exit codes, bad input."""

from __future__ import annotations

import gzip
import json
import sys

import pytest

from .conftest import FIXTURES, run

KV_LOG = FIXTURES / "logs" / "vllm" / "kv-cache-too-small-v1.log"
HEALTHY = FIXTURES / "logs" / "vllm" / "healthy-v1-serving.log"


def test_scan_text_report(cli):
    p = run([*cli, "scan", str(KV_LOG)])
    out = p.stdout.decode()
    assert p.returncode == 1
    assert out.splitlines()[0].startswith("✗ failed: KV cache cannot hold one request of max_model_len")
    assert "--max-model-len 72704" in out and "(was 131072)" in out
    assert "\x1b[" not in out  # piped: no colour codes


def test_scan_json_schema(cli):
    p = run([*cli, "scan", "--json", str(KV_LOG)])
    doc = json.loads(p.stdout)
    assert p.returncode == 1
    assert list(doc)[:12] == [
        "schema",
        "source",
        "engine",
        "status",
        "last_phase",
        "primary",
        "findings",
        "timeline",
        "launch",
        "device",
        "advice",
        "kb",
    ]
    assert doc["schema"] == 1 and doc["status"] == "failed"
    assert (
        doc["engine"]["name"] == "vllm"
        and doc["engine"]["variant"] == "v1"
        and doc["engine"]["version"] == "0.10.1.1"
    )
    pr = doc["primary"]
    assert {"rule", "class", "layer", "oom_phase", "severity", "line", "evidence", "facts"} <= set(pr)
    assert (
        pr["class"] == "kv_cache_too_small"
        and pr["layer"] == "memory"
        and pr["facts"]["est_max_len"] == 73024
    )
    assert doc["advice"][0] == {
        "param": "max_model_len",
        "flag": "--max-model-len",
        "from": "131072",
        "to": "72704",
        "why": doc["advice"][0]["why"],
        "verify": doc["advice"][0]["verify"],
    }
    assert doc["launch"]["max_model_len"] == 131072 and doc["launch"]["gpu_memory_utilization"] == 0.9
    assert [m["phase"] for m in doc["timeline"]][:3] == ["devices", "start", "args"]


def test_pipe_without_command_means_scan(cli):
    p = run(cli, stdin=HEALTHY.read_bytes())
    assert p.returncode == 0 and p.stdout.decode().startswith("✓ ready")
    p = run([*cli, "scan", "-", "--json"], stdin=KV_LOG.read_bytes())
    assert json.loads(p.stdout)["source"] == "-"
    # scan's options without the command: still a scan of the pipe
    q = run([*cli, "--json", "--engine", "vllm"], stdin=KV_LOG.read_bytes())
    assert q.returncode == p.returncode and json.loads(q.stdout)["primary"] == json.loads(p.stdout)["primary"]
    assert run([*cli, "--nosuch"], stdin=b"x\n").returncode == 2  # not a scan option: the CLI says so


def test_python_dash_m(cli):
    p = run([sys.executable, "-m", "diagnose", "scan", "--format", "markdown", str(KV_LOG)])
    out = p.stdout.decode()
    assert (
        p.returncode == 1
        and out.startswith("### ✗ failed")
        and "**Next change:** `--max-model-len 72704" in out
    )


def test_gz_input(cli):
    p = run([*cli, "scan", "--json", str(FIXTURES / "logs" / "vllm" / "kv-cache-too-small-v1-gz.log.gz")])
    assert json.loads(p.stdout)["primary"]["class"] == "kv_cache_too_small"


def _file(d, name, data):
    (d / name).write_bytes(data)
    return str(d / name)


@pytest.mark.parametrize(
    "make,msg",
    [
        (lambda d: str(d / "nope.log"), "no such file"),
        (lambda d: str(d), "is a directory"),
        (lambda d: _file(d, "e.log", b""), "empty input"),
        (lambda d: _file(d, "b.bin", b"\x7fELF\x00\x00\x01"), "binary data"),
        (lambda d: _file(d, "t.gz", gzip.compress(b"hello\n" * 1000)[:-30]), "gzip"),
    ],
)
def test_bad_input_is_one_line_exit_2(cli, tmp_path, make, msg):
    p = run([*cli, "scan", make(tmp_path)])
    err = p.stderr.decode()
    assert p.returncode == 2 and msg in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_usage_error_exit_2(cli):
    p = run([*cli, "scan", "--engine", "nosuchengine", str(KV_LOG)])
    assert p.returncode == 2 and "Traceback" not in p.stderr.decode()


def test_weird_but_valid_input(cli, tmp_path):
    f = tmp_path / "w.log"
    f.write_bytes(
        b"\xff\xfe garbage \x1b[31mred\x1b[0m\r\n"
        + b"z" * (2 << 20)
        + b"\nINFO:     Application startup complete."
    )
    p = run([*cli, "scan", "--json", str(f)])
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["status"] == "ready"


def test_broken_rule_dir_warns_and_continues(cli, tmp_path):
    (tmp_path / "bad.yaml").write_text("- id: bad.rule\n  engines: [any]\n  severity: fatal\n  class: nope\n")
    p = run([*cli, "scan", "--rules", str(tmp_path), str(KV_LOG)])
    assert p.returncode == 1
    assert (
        "bad.yaml: rule bad.rule: field 'needles': missing (skipped)" in p.stderr.decode()
        and "failed" in p.stdout.decode()
    )


def test_rules_commands(cli):
    p = run([*cli, "rules", "list"])
    assert p.returncode == 0 and "torch.oom" in p.stdout.decode()
    p = run([*cli, "rules", "show", "vllm.kv-cache-too-small.v1"])
    out = p.stdout.decode()
    assert (
        p.returncode == 0
        and "Why it happens" in out
        and "--max-model-len" in out
        and "--context-length" not in out  # a vLLM rule: only vLLM's spelling
    )
    # a rule for every engine shows each engine's own spelling, where the engine has the setting
    out = run([*cli, "rules", "show", "torch.oom"]).stdout.decode()
    assert "sglang: --mem-fraction-static" in out and "lmdeploy: --cache-max-entry-count" in out
    assert "ollama:" not in out.split("tensor_parallel_size", 1)[1].splitlines()[0]
    p = run([*cli, "rules", "show", "no.such.rule"])
    assert p.returncode == 2
    p = run([*cli, "rules", "test", str(KV_LOG)])
    out = p.stdout.decode()
    assert p.returncode == 0 and "0 fail" in out and "vllm.kv-cache-too-small.v1" in out


def test_color_only_on_a_terminal(cli):
    p = run([*cli, "scan", str(KV_LOG)], env={"NO_COLOR": "", "FORCE_COLOR": "1"})
    assert "\x1b[" in p.stdout.decode()
    p = run([*cli, "scan", str(KV_LOG)], env={"NO_COLOR": "1", "FORCE_COLOR": ""})
    assert "\x1b[" not in p.stdout.decode()


def test_a_guessed_oom_phase_is_said_to_be_a_guess(cli):
    # a lone PyTorch OOM line (no phase markers, no stack): the headline must not claim a phase
    line = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.68 GiB of which 1.50 GiB is free.\n"
    p = run([*cli, "scan", "-"], stdin=line)
    head = p.stdout.decode().splitlines()[0]
    assert p.returncode == 1 and "phase not in the log (assumed startup)" in head, head
    p = run([*cli, "scan", "-", "--json"], stdin=line)
    assert json.loads(p.stdout)["primary"]["oom_phase_from"] == "default"


def test_options_out_of_range_are_usage_errors(cli, tmp_path):
    cfg = sorted((FIXTURES / "configs").glob("*.json"))[0]
    for args in (
        ["plan", "--config", str(cfg), "--max-model-len", "-5"],
        ["plan", "--config", str(cfg), "--gpu-memory-utilization", "1.5"],
        ["plan", "--config", str(cfg), "--gpu-memory-utilization", "nan"],
        ["plan", "--config", str(cfg), "--tp", "0"],
        ["plan", "--config", str(cfg), "--gpus", "0x80"],
        ["probe", "--max-tokens", "-3"],
        ["check", "--", "vllm", "serve", "m", "--tensor-parallel-size", "abc"],
        ["check", "--", "vllm", "serve", "m", "--gpu-memory-utilization", "1.5"],
        ["check", "--", "ls", "-la"],
        ["plan", "--config", str(cfg), "--kv-cache-dtype", "bogus"],
        ["plan", "--config", str(cfg), "--gpus", "2x-80"],
        ["plan", "--config", str(cfg), "--gpus", "1x1e400"],
        ["watch", "--timeout", "-1", str(cfg)],
        ["watch", "--budget", "-5", str(cfg)],
        ["watch", "--budget", "load_weights=nan", str(cfg)],
        ["run", "--timeout", "-5", "--", "true"],
        ["probe", "http://127.0.0.1:70000"],
        ["probe", "http://127.0.0.1:-3"],
        ["probe", "http://127.0.0.1:80x"],
    ):
        p = run([*cli, *args])
        err = p.stderr.decode()
        assert p.returncode == 2, (args, p.stdout, err)
        assert "Traceback" not in err and "internal error" not in err, (args, err)
        # one line, as the README promises, naming what was wrong
        assert len(err.strip().splitlines()) == 1 and err.startswith("diagnose: error: "), (args, err)


def test_a_launch_on_a_port_that_is_no_port_cannot_work(cli):
    for port in ("70000", "-1", "http"):
        p = run([*cli, "check", "--json", "--", "vllm", "serve", "m", "--port", port])
        doc = json.loads(p.stdout)
        assert p.returncode == 1 and doc["problems"][0]["param"] == "port", doc
        assert doc["problems"][0]["change"]["to"] == "8000"


def test_scan_accepts_gpus_as_count_and_size(cli, tmp_path):
    log = tmp_path / "tp.log"
    log.write_text(
        "INFO 05-26 18:53:37 [api_server.py:1043] vLLM API server version 0.8.5.post1\n"
        "INFO 05-26 18:53:37 [api_server.py:1044] args: Namespace(model_tag='x', tensor_parallel_size=4)\n"
    )
    p = run([*cli, "scan", "--json", "--gpus", "2x80", str(log)])
    doc = json.loads(p.stdout)
    assert doc["device"]["count"] == 2 and doc["primary"]["class"] == "tp_mismatch"


def test_user_mistakes_are_named_not_internal_errors(cli, tmp_path):
    a_file = tmp_path / "kb-is-a-file"
    a_file.write_text("x")
    log = str(FIXTURES / "logs" / "vllm" / "oom-load-v1-tp2.log")
    binary = tmp_path / "bundle.yaml"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\xff" * 20)
    cfg = tmp_path / "config.json"
    cfg.write_text(
        '{"hidden_size": "abc", "num_hidden_layers": 2, "num_attention_heads": 0, "vocab_size": 5}'
    )
    for args, env in (
        (["kb", "add", "--from-log", log, "--root-cause", "x"], {"DIAGNOSE_KB": str(a_file)}),
        (["kb", "import", str(binary)], {"DIAGNOSE_KB": str(tmp_path / "kb")}),
        (["plan", "--config", str(cfg)], {}),
    ):
        p = run([*cli, *args], env=env)
        err = p.stderr.decode()
        assert p.returncode == 2 and "internal error" not in err and len(err.strip().splitlines()) == 1, (
            args,
            err,
        )


def test_the_outputs_are_one_registry():
    """--format takes exactly the registry's outputs, each renderer a module of its own."""
    import importlib

    from diagnose.cli.app import Format
    from diagnose.cli.fast_scan import FORMATS
    from diagnose.outputs.registry import OUTPUTS

    assert [f.value for f in Format] == list(OUTPUTS) == list(FORMATS)
    for out in OUTPUTS.values():
        assert callable(importlib.import_module(f"diagnose.outputs.{out.module}").render)


def test_json_is_strict_json_when_a_launch_says_inf_or_nan(cli):
    """JSON has no Infinity or NaN: a launch value that reads as one is said as a string."""

    def strict(text: bytes) -> dict:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))

    dump = b"INFO 05-26 18:53:37 [api_server.py:1044] args: Namespace(model_tag='x', port=inf, max_model_len=nan)\n"
    doc = strict(run([*cli, "scan", "--json", "-"], stdin=dump).stdout)
    assert doc["launch"]["port"] == "inf" and doc["launch"]["max_model_len"] == "nan"
    doc = strict(run([*cli, "check", "--json", "--", "vllm", "serve", "m", "--port", "inf"]).stdout)
    assert doc["problems"][0]["param"] == "port"
