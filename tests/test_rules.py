"""Every rule proves itself on its own examples; broken rules are named, never a traceback."""

from __future__ import annotations

import textwrap

import pytest

from diagnose.base.errors import RuleError
from diagnose.knowledge.engine_profiles import load_profiles, parse_profile
from diagnose.knowledge.rules import load_rules, parse_rule, rule_matches_text
from diagnose.model.records import CLASSES

RULES = load_rules(include_builtin=True).rules
PROFILES = load_profiles()


def test_builtin_rules_load_clean():
    rs = load_rules()
    assert rs.problems == []
    assert len(rs.rules) >= 60
    assert len({r.id for r in rs.rules}) == len(rs.rules)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_rule_matches_its_examples(rule):
    assert rule.examples_match and rule.examples_no_match, "every rule needs both kinds of examples"
    for e in rule.examples_match:
        assert rule_matches_text(rule, e, PROFILES.layout), e
    for e in rule.examples_no_match:
        assert not rule_matches_text(rule, e, PROFILES.layout), e


@pytest.mark.parametrize(
    "marker", PROFILES.markers, ids=lambda m: f"{m.engine}.{m.what}.{m.phase or m.kind or m.variant or ''}"
)
def test_profile_marker_matches_its_examples(marker):
    for e in marker.examples:
        line = PROFILES.layout.fresh().line("ex", 1, e.encode())
        assert any(n in line.text for n in marker.needles)
        assert marker.search(marker.target(line)), e


def test_each_class_is_covered():
    covered = {r.cls for r in RULES if r.severity != "ignore"}
    for cls in CLASSES:
        assert cls in covered, f"no rule for class {cls}"


GOOD = dict(
    id="x.y",
    engines=["any"],
    severity="fatal",
    needles=["boom"],
    pattern="boom (?P<n>\\d+)",
    title="Boom",
    examples={"match": ["boom 1"], "no_match": ["bam 1"]},
)
GOOD["class"] = "oom"


@pytest.mark.parametrize(
    "change,field,problem",
    [
        ({"colour": "red"}, "colour", "unknown key"),
        ({"title": ""}, "title", "non-empty"),
        ({"class": "explosion"}, "class", "not in the taxonomy"),
        ({"pattern": "boom (?P<n"}, "pattern", "does not compile"),
        ({"examples": {"match": ["bam 2"], "no_match": ["x"]}}, "examples.match", "does not match"),
        (
            {"examples": {"match": ["boom 1"], "no_match": ["boom 2"]}},
            "examples.no_match",
            "matches its no_match",
        ),
        ({"examples": {"match": ["boom 1"]}}, "examples.no_match", "non-empty"),
        ({"needles": []}, "needles", "non-empty"),
        ({"severity": "meh"}, "severity", "is not one of"),
        ({"engines": ["not an engine"]}, "engines", "unknown engine"),
        ({"advice": [{"param": "max_concurrent_requestz"}]}, "advice", "not a canonical parameter"),
        ({"advice": [{"param": "env:VLLM_NCCL_SO_PATH"}]}, "advice", "needs a 'to' value"),
        ({"advice": [{"param": "action:reboot"}]}, "advice", "is not one of"),
        ({"advice": [{"param": "max_model_len", "to": "{missing}"}]}, "advice.to", "not a named group"),
        ({"advice": [{"param": "port", "to": "1", "why": "{x*2} s"}]}, "advice.why", "not a named group"),
    ],
)
def test_rule_validation_names_file_rule_and_field(change, field, problem):
    raw = {**GOOD, **change}
    with pytest.raises(RuleError) as e:
        parse_rule(raw, "rules/custom.yaml", 0)
    assert e.value.path == "rules/custom.yaml" and e.value.rule_id == "x.y" and e.value.field == field
    assert problem in str(e.value)
    assert str(e.value).startswith("rules/custom.yaml: rule x.y: field ")


def test_missing_field_is_named():
    raw = {k: v for k, v in GOOD.items() if k != "pattern"}
    with pytest.raises(RuleError, match=r"rule x\.y: field 'pattern': missing"):
        parse_rule(raw, "f.yaml", 0)


# A valid user rule (as a user's rule file holds it), shared by the rule-directory tests.
QUOTA_RULE_YAML = textwrap.dedent("""
    - id: mine.ok
      engines: [any]
      class: request
      severity: error
      needles: ["quota exceeded"]
      pattern: 'quota exceeded for (?P<user>\\w+)'
      title: A user ran out of quota
      examples:
        match: ["ERROR quota exceeded for bob"]
        no_match: ["INFO quota fine"]
""")


def test_broken_rule_among_good_ones_is_skipped_with_a_warning(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        QUOTA_RULE_YAML
        + textwrap.dedent("""
        - id: mine.broken
          engines: [any]
          class: request
          severity: error
          needles: ["x"]
          pattern: '(unclosed'
          title: Broken
          examples: {match: ["x"], no_match: ["y"]}
    """)
    )
    (tmp_path / "garbage.yaml").write_text("- id: [unclosed\n  : :\n")
    rs = load_rules([str(tmp_path)])
    ids = {r.id for r in rs.rules}
    assert "mine.ok" in ids and "mine.broken" not in ids and "torch.oom" in ids
    assert any("mine.broken: field 'pattern'" in p for p in rs.problems)
    assert any("garbage.yaml" in p and "not valid YAML" in p for p in rs.problems)


def test_pathological_pattern_times_out_instead_of_hanging():
    raw = {**GOOD, "pattern": "(a+)+$", "needles": ["a"], "examples": {"match": ["aaa"], "no_match": ["b"]}}
    rule = parse_rule(raw, "f.yaml", 0)
    assert rule.search("a" * 40 + "b") is None


def test_profile_validation_names_the_field():
    # a broken marker is reported and skipped; the rest of the profile is kept
    prof = parse_profile(
        {
            "engine": "x",
            "phases": [
                {"phase": "lunch", "needles": ["a"], "pattern": "a", "examples": ["a"]},
                {"phase": "ready", "needles": ["up"], "pattern": "up", "examples": ["up"]},
            ],
        },
        "p.yaml",
    )
    assert [m.phase for m in prof.markers] == ["ready"]
    assert prof.problems == [
        "p.yaml: rule x.phases[0]: field 'phase': 'lunch' is not one of "
        "start, args, devices, distributed_init, load_weights, weights_loaded, kv_cache, "
        "cuda_graphs, listening, ready, serving"
    ]
    with pytest.raises(RuleError, match="unknown key"):
        parse_profile({"engine": "x", "colour": 1}, "p.yaml")


def test_validation_cache_trusts_only_unchanged_files(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAGNOSE_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "rules"
    d.mkdir()
    good = QUOTA_RULE_YAML
    (d / "mine.yaml").write_text(good)
    first = load_rules([str(d)], include_builtin=False)
    assert first.problems == [] and first.rules[0].compiled is not None  # validated: compiled now
    second = load_rules([str(d)], include_builtin=False)
    assert second.rules[0].compiled is None  # trusted from the cache: compiled on first use
    assert second.rules[0].search("quota exceeded for ann")["user"] == "ann"
    (d / "mine.yaml").write_text(good.replace("(?P<user>\\w+)", "(?P<user>\\w+"))  # now broken
    third = load_rules([str(d)], include_builtin=False)
    assert third.rules == [] and "does not compile" in third.problems[0]


def test_advice_values_are_filled_from_the_pattern_groups():
    from diagnose.model.canonical_params import fill_template

    assert fill_template("{waited_s*3}", {"waited_s": "600"}) == "1800"
    assert fill_template("{n/2} tokens of {n}", {"n": "8,192"}) == "4096 tokens of 8,192"
    with pytest.raises(KeyError):
        fill_template("{nope}", {})


def test_every_shipped_rule_keeps_the_advice_contract():
    """Every shipped rule's advice names a canonical param, with a value or one the code computes."""
    from diagnose.model.canonical_params import param_problem

    for r in RULES:
        for a in r.advice:
            assert param_problem(a["param"], "to" in a) is None, (r.id, a)


def test_a_user_pattern_that_times_out_is_named_not_silent(cli, tmp_path):
    """`^(a|aa)+$` backtracks: the scan gives it up after a few lines and says which rule."""
    from .conftest import run

    rules = tmp_path / "r"
    rules.mkdir()
    (rules / "evil.yaml").write_text(
        "- id: mine.evil\n  engines: [any]\n  class: unknown_error\n  severity: error\n"
        "  needles: [aaaa]\n  pattern: '^(a|aa)+$'\n  title: Evil\n"
        "  examples: {match: [aaaa], no_match: [aaab]}\n"
    )
    log = tmp_path / "x.log"
    log.write_text(("a" * 40 + "b\n") * 50)
    p = run([*cli, "scan", "--rules", str(rules), str(log)])
    err = p.stderr.decode()
    assert "rule mine.evil: field 'pattern': timed out on 3 line(s)" in err and "Traceback" not in err
