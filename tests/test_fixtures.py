"""Golden tests: every fixture log scanned end to end, against its expectations and its JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from diagnose.outputs.json_report import render as render_json
from diagnose.pipeline.scan import scan_paths

from .conftest import FIXTURES

EXPECTS = sorted((FIXTURES / "logs").glob("*/*.expect.yaml"))
UPDATE = os.environ.get("DIAGNOSE_UPDATE_GOLDEN") == "1"


def _log_for(expect: Path) -> Path:
    stem = expect.name[: -len(".expect.yaml")]
    for cand in (expect.with_name(stem + ".log"), expect.with_name(stem + ".log.gz")):
        if cand.exists():
            return cand
    raise FileNotFoundError(stem)


def _stable(doc: dict) -> dict:
    doc.pop("diagnose_version", None)  # the goldens outlive a release
    # a free port depends on this host at test time
    for c in doc.get("advice") or []:
        if c["param"] == "port":
            c["to"], c["why"] = "<free port>", "<depends on the host>"
    return doc


def test_enough_fixtures():
    engines = {p.parent.name for p in EXPECTS}
    assert {"vllm", "sglang", "tgi", "generic"} <= engines
    healthy = [p for p in EXPECTS if yaml.safe_load(p.read_text()).get("status") == "ready"]
    for eng in ("vllm", "sglang", "tgi"):
        assert len([p for p in healthy if p.parent.name == eng]) >= 3, eng


@pytest.mark.parametrize("expect", EXPECTS, ids=lambda p: f"{p.parent.name}/{p.name[:-12]}")
def test_fixture(know, in_root, expect):
    log = _log_for(expect).relative_to(in_root)
    want = yaml.safe_load(expect.read_text())
    d = scan_paths([str(log)], know)
    assert d.status == want["status"]
    p = d.primary
    if "primary" in want and want["primary"] is None:
        assert p is None and d.advice == []
    if "cls" in want:
        assert p is not None and p.cls == want["cls"]
        assert p.severity in ("fatal", "error", "warning")
    if "oom_phase" in want:
        assert p.oom_phase == want["oom_phase"]
    if "advice" in want:
        assert d.advice and d.advice[0].param == want["advice"]
    if "advice_to" in want:
        assert d.advice[0].to == want["advice_to"]
    golden = expect.with_name(expect.name[: -len(".expect.yaml")] + ".golden.json")
    got = _stable(json.loads(render_json(d)))
    if UPDATE or not golden.exists():
        golden.write_text(json.dumps(got, indent=2, ensure_ascii=False) + "\n")
        if not UPDATE:
            pytest.fail(f"golden file {golden.name} was missing and has been written: review it")
    assert got == json.loads(golden.read_text())


@pytest.mark.parametrize(
    "name",
    [
        "vllm/oom-load-v1-tp2",
        "sglang/oom-runtime-long-prefill",
        "tgi/healthy-ansi",
        "vllm/healthy-v1-tp4-interleaved-docker",
        "vllm/restart-after-oom",
    ],
)
def test_pure_python_needle_index_gives_the_same_diagnosis(know, in_root, monkeypatch, name):
    log = f"fixtures/logs/{name}.log"
    fast = _stable(json.loads(render_json(scan_paths([log], know))))
    monkeypatch.setenv("DIAGNOSE_PURE", "1")
    pure = _stable(json.loads(render_json(scan_paths([log], know))))
    assert pure == fast
