"""The incident store: round trips, recognition, redaction, concurrency, broken files."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from diagnose.base.redact import redact
from diagnose.pipeline.scan import scan_paths
from diagnose.store.incidents import KnowledgeBase, add_incident, incident_from, template

from .conftest import FIXTURES, run

LOGS = FIXTURES / "logs"


def kb_run(cli, *args, store, stdin=None):
    return run([*cli, *args], stdin=stdin, env={"DIAGNOSE_KB": str(store)})


def test_round_trip_add_list_show_scan(cli, tmp_path):
    store = tmp_path / "kb"
    log = LOGS / "vllm" / "oom-load-v1-tp2.log"
    p = kb_run(
        cli,
        "kb",
        "add",
        "--from-log",
        str(log),
        "--root-cause",
        "70B in bf16 on 2×80 GB",
        "--fix",
        "--tensor-parallel-size 4",
        "--path",
        "diagnose device: both GPUs idle",
        store=store,
    )
    assert p.returncode == 0 and b"added KB-0001" in p.stdout
    listed = json.loads(kb_run(cli, "kb", "list", "--json", store=store).stdout)
    mine = [r for r in listed if not r["starter"]]
    assert mine == [
        {
            "id": "KB-0001",
            "title": mine[0]["title"],
            "date": mine[0]["date"],
            "classes": ["oom"],
            "starter": False,
        }
    ]
    shown = yaml.safe_load(kb_run(cli, "kb", "show", "KB-0001", store=store).stdout)
    assert shown["root_cause"] == "70B in bf16 on 2×80 GB" and shown["symptom"]["oom_phase"] == "load"
    doc = json.loads(kb_run(cli, "scan", "--json", str(log), store=store).stdout)
    assert doc["kb"][0]["id"] == "KB-0001" and doc["kb"][0]["score"] == 1.0
    assert {"id", "score", "title", "root_cause", "fix"} <= set(doc["kb"][0])
    text = kb_run(cli, "scan", str(log), store=store).stdout.decode()
    assert "seen before  KB-0001" in text and "fixed by --tensor-parallel-size 4" in text


def test_near_duplicate_matches_and_unrelated_does_not(know, tmp_path):
    store = tmp_path / "kb"
    d = scan_paths([str(LOGS / "vllm" / "kv-cache-too-small-v1.log")], know)
    add_incident(
        store, incident_from(d, "max_model_len too long for one A100", ["--max-model-len 65536"], [])
    )
    # the same failure on another day: other numbers, pids, paths
    text = (LOGS / "vllm" / "kv-cache-too-small-v1.log").read_text()
    text = text.replace("pid=2311", "pid=98765").replace("(131072)", "(262144)").replace("73024", "121840")
    text = text.replace("13.37 GiB", "8.72 GiB").replace(
        "/usr/local/lib/python3.12", "/opt/venv/lib/python3.11"
    )
    other = tmp_path / "other.log"
    other.write_text(text)
    base = KnowledgeBase.load([store], starter=False)
    near = base.match(scan_paths([str(other)], know))
    assert near and near[0]["id"] == "KB-0001" and near[0]["score"] > 0.8
    unrelated = base.match(scan_paths([str(LOGS / "vllm" / "port-in-use-uvicorn.log")], know))
    assert unrelated == []


def test_template_masks_what_changes():
    a = template(
        "(EngineCore_0 pid=2311) GPU 0 has a total capacity of 79.19 GiB at /usr/lib/x.py 0x7f3b 12:01:02"
    )
    b = template(
        "(EngineCore_0 pid=98) GPU 3 has a total capacity of 23.56 GiB at /opt/y/z.py 0x11ff 23:59:59"
    )
    assert a == b


@pytest.mark.parametrize(
    "secret,kind",
    [
        ("HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345", "huggingface token"),
        ("--api-key sk-proj-AbCdEfGhIjKlMnOpQrSt", "openai key"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload", "bearer token"),
        ("https://alice:s3cr3t-pass@hub.example.com/models", "password in url"),
        ("api_key='token-abc123'", "secret setting"),
    ],
)
def test_each_secret_kind_is_redacted(secret, kind):
    found: dict[str, int] = {}
    out = redact(f"launched with {secret} today", found)
    assert "<redacted>" in out and kind in found
    for part in ("hf_AbCd", "sk-proj", "eyJhbGci", "s3cr3t", "token-abc123"):
        assert part not in out


def test_redaction_is_reported_by_kb_add(cli, tmp_path):
    store = tmp_path / "kb"
    p = kb_run(
        cli,
        "kb",
        "add",
        "--from-log",
        str(LOGS / "vllm" / "port-in-use-uvicorn.log"),
        "--root-cause",
        "old server still up; restarted with HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
        store=store,
    )
    assert p.returncode == 0 and b"redacted: 1 \xc3\x97 huggingface token" in p.stdout
    assert "hf_AbCd" not in (store / "KB-0001.yaml").read_text()


def test_concurrent_adds_lose_nothing(tmp_path):
    store = tmp_path / "kb"
    code = (
        "import sys; from diagnose.store.incidents import add_incident\n"
        "for i in range(10):\n"
        "    add_incident(__import__('pathlib').Path(sys.argv[1]), {'title': f'{sys.argv[2]} {i}', "
        "'date': '2026-11-29', 'symptom': {'classes': ['oom']}, 'root_cause': 'x'})\n"
    )
    procs = [subprocess.Popen([os.sys.executable, "-c", code, str(store), name]) for name in ("a", "b", "c")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    files = sorted(store.glob("KB-*.yaml"))
    assert [f.name for f in files] == [f"KB-{i:04d}.yaml" for i in range(1, 31)]
    titles = sorted(yaml.safe_load(f.read_text())["title"] for f in files)
    assert titles == sorted(f"{n} {i}" for n in "abc" for i in range(10))
    assert not list(store.glob(".*.tmp"))


def test_corrupted_incident_among_good_ones(cli, tmp_path, know):
    store = tmp_path / "kb"
    d = scan_paths([str(LOGS / "vllm" / "gpu-busy-v1.log")], know)
    add_incident(store, incident_from(d, "a leftover vLLM held the GPU", [], []))
    (store / "KB-0002.yaml").write_text(
        "id: KB-0002\ntitle: broken\ndate: yesterday\nsymptom: {classes: [oom]}\nroot_cause: x\n"
    )
    (store / "KB-0003.yaml").write_text("id: [unclosed\n")
    base = KnowledgeBase.load([store], starter=False)
    assert [i.id for i in base.incidents] == ["KB-0001"]
    assert any("KB-0002.yaml: field 'date'" in p for p in base.problems)
    assert any("KB-0003.yaml" in p for p in base.problems)
    p = kb_run(cli, "scan", str(LOGS / "vllm" / "gpu-busy-v1.log"), store=store)
    assert (
        p.returncode == 1
        and b"seen before  KB-0001" in p.stdout
        and b"KB-0002.yaml: field 'date'" in p.stderr
    )


def test_export_import_round_trip(cli, tmp_path, know):
    src, dst = tmp_path / "a", tmp_path / "b"
    for name in ("gpu-busy-v1", "port-in-use-uvicorn"):
        d = scan_paths([str(LOGS / "vllm" / f"{name}.log")], know)
        add_incident(src, incident_from(d, f"cause of {name}", [], []))
    bundle = tmp_path / "bundle.yaml"
    assert kb_run(cli, "kb", "export", "--out", str(bundle), store=src).returncode == 0
    assert len([d for d in yaml.safe_load_all(bundle.read_text()) if d]) == 2
    p = kb_run(cli, "kb", "import", str(bundle), store=dst)
    assert p.returncode == 0 and sorted(f.name for f in dst.glob("KB-*.yaml")) == [
        "KB-0001.yaml",
        "KB-0002.yaml",
    ]
    assert kb_run(cli, "kb", "search", "cause of gpu-busy", store=dst).stdout.startswith(b"KB-0001")


def test_starter_set_is_valid_and_recognises_the_seed_failures(know):
    base = KnowledgeBase.load([], starter=True)
    assert base.problems == [] and len(base.incidents) >= 9
    d = scan_paths([str(LOGS / "vllm" / "oom-startup-v1-cuda-graphs.log")], know)
    assert base.match(d)[0]["id"] == "KB-9002"


def test_kb_add_from_scan_report(cli, tmp_path):
    store = tmp_path / "kb"
    report = tmp_path / "r.json"
    report.write_bytes(
        kb_run(cli, "scan", "--json", str(LOGS / "sglang" / "tp-not-divisible.log"), store=store).stdout
    )
    p = kb_run(
        cli, "kb", "add", "--from-scan", str(report), "--root-cause", "vision tower has 16 heads", store=store
    )
    assert p.returncode == 0
    data = yaml.safe_load((store / "KB-0001.yaml").read_text())
    assert data["symptom"]["classes"] == ["tp_mismatch"] and data["fix"][0]["param"] == "tensor_parallel_size"
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    p = kb_run(cli, "kb", "add", "--from-scan", str(bad), "--root-cause", "x", store=store)
    assert p.returncode == 2 and b"schema-1" in p.stderr


def test_kb_refuses_a_scan_with_no_failure_unless_forced(cli, tmp_path):
    store = tmp_path / "kb"
    healthy = str(LOGS / "vllm" / "healthy-v1-serving.log")
    p = kb_run(cli, "kb", "add", "--from-log", healthy, "--root-cause", "x", store=store)
    assert p.returncode == 2 and b"found no failure" in p.stderr and not list(store.glob("*.yaml"))
    p = kb_run(cli, "kb", "add", "--from-log", healthy, "--root-cause", "x", "--force", store=store)
    assert p.returncode == 0


def test_importing_a_bundle_twice_adds_nothing_the_second_time(cli, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    log = str(LOGS / "vllm" / "oom-load-v1-tp2.log")
    assert kb_run(cli, "kb", "add", "--from-log", log, "--root-cause", "too big", store=src).returncode == 0
    bundle = tmp_path / "b.yaml"
    bundle.write_bytes(kb_run(cli, "kb", "export", store=src).stdout)
    assert kb_run(cli, "kb", "import", str(bundle), store=dst).returncode == 0
    p = kb_run(cli, "kb", "import", str(bundle), store=dst)
    assert p.returncode == 0 and b"already there" in p.stdout
    assert len(list(dst.glob("KB-*.yaml"))) == 1


def test_kb_show_of_a_corrupt_incident_says_corrupt(cli, tmp_path):
    store = tmp_path / "kb"
    store.mkdir()
    (store / "KB-0007.yaml").write_text("title: [unclosed\n")
    p = kb_run(cli, "kb", "show", "KB-0007", store=store)
    assert p.returncode == 2 and b"KB-0007 is corrupt" in p.stderr
