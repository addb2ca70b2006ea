"""The mined knowledge shipped in rules/mined: provenance, patterns, the class table, and what
a scan does with it (a class for an error no rule names, a phase from a frame no hint
names, a warning the engine prints itself read as part of a healthy run)."""

from __future__ import annotations

import json
import os
import random
import re

import pytest

from diagnose.base.data_files import builtin_rules_dir
from diagnose.knowledge.loaded import Knowledge
from diagnose.knowledge.mined import ClassTable, Template, knowledge
from diagnose.pipeline.scan import scan_sources
from diagnose.pipeline.stages import diagnose

MINED = os.path.join(builtin_rules_dir(), "mined")
FILES = sorted(n for n in os.listdir(MINED) if n.endswith(".json") and not n.endswith(".index.json"))


def write_log(folder, name: str, text: str) -> str:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _scan(know: Knowledge, path: str, engine: str | None = None):
    from diagnose.read.sources import resolve_sources

    result = scan_sources(resolve_sources([path]), know, engine=engine)
    return diagnose(result, know, path, engine=engine)


@pytest.mark.parametrize("name", FILES)
def test_each_mined_file_says_what_it_was_mined_from(name: str) -> None:
    with open(os.path.join(MINED, name), encoding="utf-8") as f:
        data = json.load(f)
    assert data["schema"] == 1
    assert data["generated_by"].startswith("python -m tools.mine")
    assert data["versions"] and len(data["provenance"]) == len(data["versions"])
    for prov in data["provenance"]:
        assert prov.get("sha256") or prov.get("commit"), prov
    ids = [t["id"] for t in data["templates"]]
    assert len(ids) == len(set(ids))
    assert set(data["frames"].values()) <= {"load", "startup", "runtime"}
    # a sample of patterns compiles and finds its own literal text
    rnd = random.Random(name)
    for t in rnd.sample(data["templates"], min(200, len(data["templates"]))):
        rx = re.compile(t["pattern"])
        assert t["literal"] and rx.pattern, t["id"]


def test_class_table_rows_and_params() -> None:
    table = knowledge().table
    assert table is not None

    def cls_of(
        text: str, module: str = "vllm/worker/worker.py", level: str = "raise", exc: str = "ValueError"
    ) -> tuple[str | None, str | None]:
        t = Template(
            {
                "id": "x",
                "text": text,
                "pattern": "x",
                "literal": "x",
                "level": level,
                "exc": exc,
                "module": module,
            },
            "vllm",
            "vllm",
        )
        table.classify(t)
        return t.cls, t.param

    assert cls_of(
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."
    ) == ("kv_cache_too_small", "gpu_memory_utilization")
    assert (
        cls_of("Total number of attention heads ({h}) must be divisible by tensor parallel size ({tp}).")[0]
        == "tp_mismatch"
    )
    assert cls_of("Address already in use: port {port}")[0] == "port_in_use"
    assert cls_of("NCCL error: unhandled system error")[0] == "nccl"
    assert (
        cls_of(
            "Model architectures {a} are not supported for now.",
            module="vllm/model_executor/models/registry.py",
        )[0]
        == "weights_format"
    )
    assert cls_of(
        "max_num_batched_tokens ({x}) is smaller than max_model_len ({y}).", module="vllm/config.py"
    ) == ("config", "max_num_batched_tokens")
    assert cls_of(
        "Chunked prefill is not supported with speculative decoding ({x}).", module="vllm/engine/arg_utils.py"
    ) == ("config", "enable_chunked_prefill")
    assert cls_of("Found no NVIDIA driver on your system.")[0] == "driver"
    # a message with no telling words, module or setting keeps its ignorance
    assert (
        cls_of("Unexpected value {x} for field {y}", module="vllm/utils.py", exc="RuntimeError")[0]
        == "unknown_error"
    )


def test_class_table_errors_name_the_file_and_row(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"classes.yaml: rows\[0\] \(bad\): field words"):
        ClassTable(
            {"rows": [{"id": "bad", "class": "oom", "words": "(unclosed"}]}, str(tmp_path / "classes.yaml")
        )


def test_engine_messages_from_the_reference_are_known_templates() -> None:
    k = knowledge()
    cases = [
        (
            "vllm",
            "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be stored in KV cache (73024). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
            "kv_cache_too_small",
        ),
        (
            "vllm",
            "ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).",
            "tp_mismatch",
        ),
        (
            "sglang",
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
            "kv_cache_too_small",
        ),
    ]
    for engine, line, cls in cases:
        found = k.match(line, engine)
        assert found, line
        assert found[0].template.engine == engine
        assert found[0].cls == cls, (line, found[0].template.id, found[0].template.row)


TAIL_LOAD = """\
Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/models/qwen2.py", line 489, in __init__
    self.lm_head = ParallelLMHead(config.vocab_size,
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/layers/vocab_parallel_embedding.py", line 263, in __init__
    self.quant_method.create_weights_fake(self,
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB. GPU 0 has a total capacity of 23.57 GiB of which 712.31 MiB is free. Including non-PyTorch memory, this process has 22.85 GiB memory in use.
"""


def test_a_pasted_tail_gets_its_phase_from_the_mined_call_tree(know: Knowledge, tmp_path) -> None:
    # no timeline, no frame the hand-written hints name: the layers' constructors only run
    # while the model is built, which the mined call tree of vLLM's source knows
    path = write_log(tmp_path, "tail.log", TAIL_LOAD)
    d = _scan(know, path, engine="vllm")
    assert d.primary is not None and d.primary.cls == "oom"
    assert d.primary.oom_phase == "load"
    assert "call tree" in (d.primary.phase_evidence or "")


def test_an_error_no_rule_names_gets_the_class_of_the_engines_own_message(know: Knowledge, tmp_path) -> None:
    log = (
        "INFO 03-01 10:00:00 [api_server.py:1] vLLM API server version 0.10.2\n"
        "ERROR 03-01 10:00:05 [core.py:700] EngineCore failed to start.\n"
        "ERROR 03-01 10:00:05 [core.py:700] Traceback (most recent call last):\n"
        'ERROR 03-01 10:00:05 [core.py:700]   File "/opt/vllm/vllm/v1/engine/core.py", line 691, in run_engine_core\n'
        "ERROR 03-01 10:00:05 [core.py:700]     engine_core = EngineCoreProc(*args, **kwargs)\n"
        "ERROR 03-01 10:00:05 [core.py:700] ValueError: max_num_batched_tokens (2048) is smaller than max_model_len (32768). "
        "This effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. "
        "Please increase max_num_batched_tokens or decrease max_model_len.\n"
    )
    path = write_log(tmp_path, "cfg.log", log)
    d = _scan(know, path)
    p = d.primary
    assert p is not None
    # vllm.scheduler.token-budget is a hand rule for this family: it must keep winning
    assert p.cls in ("config", "request") or p.rule.startswith("vllm.")


def test_the_mined_call_trees_alone_type_the_real_oom_tracebacks(
    know: Knowledge, tmp_path, monkeypatch
) -> None:
    """Generalisation: the labelled OOM logs of ../shared/real-logs cut to their errors and
    tracebacks (no timeline), the hand-written stack hints switched off: the phase then
    comes from the mined call trees alone (or the message, or nothing)."""
    import yaml

    from diagnose.findings import oom_phase

    from .conftest import REAL_LOGS

    if not REAL_LOGS.is_dir():
        pytest.skip("../shared/real-logs not present")
    monkeypatch.setattr(oom_phase, "stack_phase", lambda *a, **k: None)
    keep = re.compile(r'Traceback|File "|Error|error|ERROR|CRITICAL|Exception|out of memory')
    quiet = re.compile(r"\bINFO\b|\bDEBUG\b|\bWARNING\b")
    right, total, by_mined = 0, 0, 0
    for case in sorted(REAL_LOGS.iterdir()):
        label_path = case / "label.yaml"
        if not label_path.exists():
            continue
        label = yaml.safe_load(label_path.read_text())
        if not str(label.get("class", "")).startswith("oom_"):
            continue
        lines = (case / "log.txt").read_text(errors="replace").splitlines()
        excerpt = [x for x in lines if keep.search(x) and not quiet.search(x)]
        if not any('File "' in x for x in excerpt):
            continue
        path = write_log(tmp_path, case.name + ".log", "\n".join(excerpt) + "\n")
        d = _scan(know, path, engine=label["engine"])
        total += 1
        if d.primary is not None and d.primary.oom_phase == label["class"][4:]:
            right += 1
            by_mined += "call tree" in (d.primary.phase_evidence or "")
    assert total >= 12
    # measured when the miner landed: 12 of 15 right, 9 of them by the mined call trees
    assert right >= 12 and by_mined >= 9, (right, by_mined, total)


def test_rules_show_explains_a_mined_template(cli) -> None:
    from .conftest import run

    found = knowledge().match(
        "ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).",
        "vllm",
    )
    tid = found[0].template.id
    p = run([*cli, "rules", "show", tid])
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode()
    assert tid in out and "tp_mismatch" in out and "versions:" in out
    bad = run([*cli, "rules", "show", "vllm.m.0000000000"])
    assert bad.returncode == 2 and b"no mined template" in bad.stderr


@pytest.mark.parametrize("name", FILES)
def test_the_literal_index_agrees_with_a_full_parse(name: str) -> None:
    """A scan reads only the literal index and the records its literals hit (diagnose/mined.py
    Bundle); the index must find every record the JSON holds, with its own literal."""
    from diagnose.knowledge.mined import Bundle

    path = os.path.join(MINED, name)
    with open(path, encoding="utf-8") as f:
        full = {r["id"]: r for r in json.load(f)["templates"]}
    from diagnose.knowledge.mined_index import index_path_of, scan_store

    with open(index_path_of(path), encoding="utf-8") as f:
        shipped = json.load(f)
    assert shipped == scan_store(path), "stale index: python -m tools.mine.store"
    got = Bundle(path).templates
    assert len(got) == len(full)
    assert all(full[t.id]["literal"] == t.literal for t in got)


def test_a_tgi_router_oom_is_runtime_by_the_module_that_prints_it(know: Knowledge, tmp_path) -> None:
    # the router's line alone (a pasted excerpt, no timeline, no Python stack): TGI's router
    # only prints "Request failed during generation" while serving a request
    line = (
        "2024-05-02T10:11:12.345678Z ERROR generate{parameters=GenerateParameters { best_of: None, "
        'max_new_tokens: Some(1024) } total_time="2.1s"}:generate:generate_stream:infer:send_error: '
        "text_generation_router::infer: router/src/infer/mod.rs:866: Request failed during generation: "
        "Server error: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB "
        "of which 1.12 GiB is free.\n"
    )
    d = _scan(know, write_log(tmp_path, "tgi.log", line), engine="tgi")
    assert d.primary is not None and d.primary.cls == "oom"
    assert d.primary.oom_phase == "runtime", d.primary.phase_evidence


def test_a_refused_setting_no_template_knows_is_config_with_the_flag_it_names(
    know: Knowledge, tmp_path
) -> None:
    # a message newer than every mined version, logged by vLLM's argument module at the end of
    # the startup: the class table reads its words and the logger's location
    log = (
        "INFO 03-01 10:00:00 [api_server.py:1] vLLM API server version 0.10.2\n"
        "ERROR 03-01 10:00:05 [arg_utils.py:1490] --kv-cache-offload-size requires --kv-transfer-config "
        "with an offloading connector.\n"
    )
    d = _scan(know, write_log(tmp_path, "cfg.log", log))
    p = d.primary
    assert p is not None and p.cls == "config" and p.confidence == "low"
    assert p.rule == "mined.table.setting-conflict"
    assert d.advice and d.advice[0].flag == "--kv-cache-offload-size"
    assert d.to_json()["primary"]["layer"] == "configuration"


def test_a_line_the_engine_prints_as_a_warning_is_no_failure(know: Knowledge, tmp_path) -> None:
    # SGLang logs a missing optional generation config at WARNING; here a collector marked its
    # stderr ERROR and the log ends on it (before: "The startup ends on an error no rule explains")
    log = (
        "[2025-06-17 03:52:00] server_args=ServerArgs(model_path='org/model', tp_size=1, port=30000)\n"
        "[2025-06-17 03:52:01] ERROR Failed to load generation config for org/model: 404 Client Error: Entry Not "
        "Found for url: https://huggingface.co/org/model/resolve/main/generation_config.json. Proceeding without "
        "generation config.\n"
    )
    d = _scan(know, write_log(tmp_path, "gen.log", log))
    assert d.status == "incomplete" and d.primary is None


def test_rules_list_says_what_was_mined(cli) -> None:
    from .conftest import run

    p = run([*cli, "rules", "list"])
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode()
    assert "mined from the engines' own sources" in out
    assert "vllm 0.2.7–0.34.0" in out


@pytest.mark.parametrize("name", ["vllm.json", "sglang.json", "torch.json", "llamacpp.json"])
def test_the_shipped_word_index_finds_what_every_substring_test_finds(name: str) -> None:
    """After WORD_INDEX_AFTER lines a file answers from the word index its .index.json ships:
    the same templates, in the same order, as testing every literal on the line."""
    from pathlib import Path

    from diagnose.knowledge import mined

    root = Path(__file__).resolve().parent.parent
    lines = [
        x
        for p in sorted((root / "fixtures" / "logs").glob("*/*.log"))
        for x in p.read_text(encoding="utf-8", errors="replace").splitlines()
        if "Error" in x or "error" in x or "ERROR" in x
    ]
    random.Random(3).shuffle(lines)
    linear = mined.Bundle(os.path.join(MINED, name))
    indexed = mined.Bundle(os.path.join(MINED, name))
    indexed._asked = mined.WORD_INDEX_AFTER  # answers from the word index from the first line on
    found = 0
    for line in lines[:2000]:
        linear._asked = 0
        want = [t.id for t in linear.candidates(line)]
        assert [t.id for t in indexed.candidates(line)] == want, line
        found += bool(want)
    assert found > 5  # lines a template explains were among them
