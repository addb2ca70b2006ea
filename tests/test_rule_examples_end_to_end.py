"""Every rule, end to end: its first example line (a real line of its engine) as a one-line
log is diagnosed as the rule's class, by that rule, with a next change for every failure.
A rule whose example alone cannot show that is excused here by name, with the reason."""

from __future__ import annotations

import pytest

from .conftest import FIXTURES

# rule id -> why its example alone is not diagnosed as its own finding
EXCUSED = {
    "any.port-in-use.errno98": "its example is uvicorn's line, which the more specific uvicorn rule takes",
    "ggml.oom.device-alloc": "a bare allocator line: its phase comes from the timeline a one-line log lacks",
}


def _rules(know):  # type: ignore[no-untyped-def]
    return [r for r in know.rules.rules if r.layer == "rule" and r.severity in ("fatal", "error")]


def test_the_rule_list_is_not_empty(know):
    assert len(_rules(know)) > 80


@pytest.fixture(scope="module")
def every_rule():  # type: ignore[no-untyped-def]
    from diagnose.knowledge.loaded import Knowledge

    know = Knowledge.load()
    return know, _rules(know)


def test_every_failure_rule_diagnoses_its_own_example_with_a_change(every_rule, tmp_path):
    from diagnose.pipeline.scan import scan_paths

    know, rules = every_rule
    wrong = []
    for r in rules:
        if r.id in EXCUSED:
            continue
        log = tmp_path / f"{r.id}.log"
        log.write_text(r.examples_match[0] + "\n")
        d = scan_paths([str(log)], know)
        p = d.primary
        if p is None or p.cls != r.cls:
            wrong.append(f"{r.id}: got {p and p.cls} ({p and p.rule}) for {r.examples_match[0][:90]!r}")
        elif r.severity == "fatal" and not d.advice and r.cls not in ("unknown_error",):
            wrong.append(f"{r.id}: no next change")
    assert not wrong, "\n".join(wrong)


def test_the_excused_rules_exist(know):
    ids = {r.id for r in know.rules.rules}
    assert set(EXCUSED) <= ids


def test_every_engine_has_fixture_logs():
    engines = {p.name for p in (FIXTURES / "logs").iterdir() if p.is_dir()}
    assert {"vllm", "sglang", "tgi", "generic", "ollama", "llamacpp", "lmdeploy", "trtllm"} <= engines
