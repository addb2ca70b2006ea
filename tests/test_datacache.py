"""The cache of validated rule, profile and incident files: a shortcut that can never be wrong
for long, nor break a scan."""

from __future__ import annotations

import datetime as dt
import os

from diagnose.base.validated_cache import DataCache, data_cache
from diagnose.knowledge.rules import load_rules
from diagnose.store.incidents import KnowledgeBase

from .test_rules import QUOTA_RULE_YAML


def test_round_trip_across_processes_with_dates(tmp_path):
    src = tmp_path / "incident.yaml"
    src.write_text("x: 1\n")
    data = {"date": dt.date(2026, 3, 1), "when": dt.datetime(2026, 3, 1, 12, 30), "tags": ["a", 1, None]}
    first = DataCache(str(tmp_path / "c" / "validated.marshal"))
    first.put(str(src), data)
    first.save()
    second = DataCache(str(tmp_path / "c" / "validated.marshal"))  # what a later run reads
    assert second.get(str(src)) == (True, data)


def test_an_edit_invalidates_even_at_the_same_size(tmp_path):
    src = tmp_path / "r.yaml"
    src.write_text("a: 1\n")
    cache = DataCache(str(tmp_path / "validated.marshal"))
    cache.put(str(src), {"a": 1})
    assert cache.get(str(src))[0]
    src.write_text("a: 2\n")
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert cache.get(str(src)) == (False, None)


def test_a_corrupt_or_foreign_cache_is_ignored_and_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGNOSE_CACHE", str(tmp_path))
    (tmp_path / "validated.marshal").write_bytes(b"\x00garbage\xff")
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "mine.yaml").write_text(QUOTA_RULE_YAML)
    first = load_rules([str(rules)], include_builtin=False)
    assert first.problems == [] and first.rules[0].compiled is not None  # validated, not trusted
    assert DataCache(str(tmp_path / "validated.marshal")).get(str(rules / "mine.yaml"))[0]


def test_an_unwritable_cache_directory_costs_nothing_but_speed(tmp_path, monkeypatch):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    monkeypatch.setenv("DIAGNOSE_CACHE", str(blocker / "sub"))
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "mine.yaml").write_text(QUOTA_RULE_YAML)
    assert load_rules([str(rules)], include_builtin=False).problems == []
    assert not (blocker / "sub").exists()


def test_off_disables_it(monkeypatch):
    monkeypatch.setenv("DIAGNOSE_CACHE", "off")
    assert data_cache().file is None and data_cache().get(__file__) == (False, None)


def test_incident_store_read_from_the_cache_matches_a_fresh_read(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGNOSE_CACHE", str(tmp_path / "cache"))
    store = tmp_path / "kb"
    store.mkdir()
    (store / "KB-0001.yaml").write_text(
        "id: KB-0001\ntitle: t\ndate: 2026-02-03\nsymptom: {classes: [oom]}\nroot_cause: r\n"
    )
    fresh = KnowledgeBase.load([str(store)], starter=False)
    cached = KnowledgeBase.load([str(store)], starter=False)
    assert fresh.incidents[0].data == cached.incidents[0].data
    assert cached.incidents[0].data["date"] == dt.date(2026, 2, 3)
