"""The Hyperscan gate (search/hyperscan_gate.py): every shipped pattern compiles as one, it
never refuses a text `re` finds a match in, and a scan says the same with it on every search."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from diagnose.knowledge.loaded import Knowledge
from diagnose.outputs.json_report import render
from diagnose.pipeline.scan import scan_paths
from diagnose.search import patterns
from diagnose.search.hyperscan_gate import Gate, gate_for

pytest.importorskip("hyperscan", reason="no hyperscan wheel for this platform")

ROOT = Path(__file__).resolve().parent.parent
LOGS = sorted((ROOT / "fixtures" / "logs").glob("*/*.log"))


@pytest.fixture(scope="module")
def know() -> Knowledge:
    return Knowledge.load()


@pytest.fixture(scope="module")
def gates(know: Knowledge) -> dict[str, Gate | None]:
    return {r.id: gate_for(r.pattern) for r in know.rules.rules}


def test_every_shipped_pattern_compiles_as_a_gate(gates: dict[str, Gate | None]) -> None:
    assert len(gates) > 100
    assert [rid for rid, g in gates.items() if g is None] == []


def test_the_gate_never_refuses_a_text_re_matches(know: Knowledge, gates: dict[str, Gate | None]) -> None:
    """Each rule's own examples and the fixture logs' lines (all of them where a rule
    matches, a sample elsewhere): where `re` finds a match, the gate lets it through."""
    lines = [x for p in LOGS for x in p.read_text(encoding="utf-8", errors="replace").splitlines()]
    random.Random(7).shuffle(lines)
    matched = refused = 0
    for r in know.rules.rules:
        gate = gates[r.id]
        assert gate is not None
        for text in [*r.examples_match, *r.examples_no_match, *lines[:1500]]:
            if r.search(text) is not None:
                matched += 1
                assert not gate.cannot_match(text), (r.id, text[:200])
            elif gate.cannot_match(text):
                refused += 1
    assert matched > 300 and refused > 100_000  # it was asked about both, many times


def test_the_gate_stands_aside_where_the_engines_read_characters_differently() -> None:
    gate = gate_for(r"(?i)caf\w\s+error")
    assert gate is not None
    # non-ASCII letters (re folds and classes them as Unicode) and U+001C-U+001F (whitespace
    # to re's \s): the gate cannot tell, so it never refuses
    assert not gate.cannot_match("CAFÉ error" + " " * 3000)
    assert not gate.cannot_match("cafe\x1cerror" + " " * 3000)
    assert gate.cannot_match("nothing to see" + " " * 3000)


def test_a_scan_says_the_same_with_the_gate_on_every_search(
    know: Knowledge, monkeypatch: pytest.MonkeyPatch
) -> None:
    def diagnoses(k: Knowledge) -> list[str]:
        return [json.dumps(json.loads(render(scan_paths([str(p)], k))), sort_keys=True) for p in LOGS]

    without = diagnoses(know)
    monkeypatch.setattr(patterns, "GATE_FROM", 0)
    monkeypatch.setattr(patterns, "GATE_AFTER", 0)
    # a knowledge whose patterns were never searched: each builds its gate on its first text
    assert diagnoses(Knowledge.load()) == without
