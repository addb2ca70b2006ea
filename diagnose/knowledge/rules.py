"""Rules as data: loading, validating and compiling the YAML files under rules/."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ..base.data_files import builtin_rules_dir, data_dirs, yaml_files
from ..base.errors import RuleError
from ..base.validated_cache import data_cache
from ..base.validated_cache import load_yaml as _load_yaml
from ..model.canonical_params import TEMPLATE_RE, param_problem
from ..search.patterns import compile_checked
from ..search.patterns import compile_pattern as _compile

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

    from ..read.prefixes import Layout

# `rule`: a specific message, reported as a finding. `vocabulary`: a class's words, used only
# to name the class of an error no rule explains (an unexplained traceback, an engine's
# "worker failed" summary), with lower confidence; never a finding by itself.
LAYERS = ("rule", "vocabulary")
ANY_ENGINE = "any"  # a rule for every engine; the other names are the engine profiles (rules/engines/)
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


@dataclass(slots=True)
class Rule:
    """One rule of a rules file."""

    id: str
    engines: list[str]
    cls: str | None
    severity: str
    needles: list[str]
    pattern: str
    title: str
    examples_match: list[str]
    examples_no_match: list[str]
    path: str
    compiled: Any = None
    why: str = ""
    advice: list[dict[str, str]] = field(default_factory=list)
    consequence: bool = False
    oom_phase: str | None = None
    # a wrapper that names the step its process failed in: a failure it reports (that process's,
    # or a sibling rank's in the same second) is in this phase; "method": the phase of the
    # function its `method` group names, by the engine's call tree
    wraps_phase: str | None = None
    scope: str = "message"  # match the message after prefixes, or the whole "text"
    shipped: bool = False  # from the package's own rules/: runs on `re` (patterns.py)
    layer: str = "rule"

    def search(self, text: str) -> Any:
        return self._pattern().search(text)

    def may_match(self, text: str) -> bool:
        """False only where the text lacks the literals every match needs (patterns.py)."""
        may = getattr(self._pattern(), "may_match", None)  # a user's pattern: no prefilter
        return True if may is None else bool(may(text))

    def may_match_ascii(self, raw: bytes, lowered: bytes) -> bool:
        """may_match() of an ASCII text given as its bytes (patterns.ShippedPattern)."""
        may = getattr(self._pattern(), "may_match_ascii", None)
        return True if may is None else bool(may(raw, lowered))

    def _pattern(self) -> Any:
        if self.compiled is None:  # validated earlier (cache): compiled on first use
            self.compiled = _compile(self.pattern, self.shipped, checked=True)
        return self.compiled


def _need(cond: bool, path: str, rid: str | None, fld: str, problem: str) -> None:
    if not cond:
        raise RuleError(path, rid, fld, problem)


def _pattern_groups(pattern: str) -> set[str]:
    return set(re.findall(r"\(\?P<(\w+)>", pattern))


def check_engines(engines: list[str], path: str, label: str, known: set[str] | None) -> None:
    """Engine names are profile names (or `any`); without the profiles at hand, their form only."""
    if known is None:
        bad = [e for e in engines if not (isinstance(e, str) and _ID_RE.match(e))]
    else:
        bad = [e for e in engines if e != ANY_ENGINE and e not in known]
    if bad:  # the message is built only for a broken rule: this runs for every rule at start
        allowed = ", ".join(sorted({*(known or ()), ANY_ENGINE})) if known is not None else "profile names"
        raise RuleError(path, label, "engines", f"unknown engine {bad[0]!r} (allowed: {allowed})")


_SCHEMA: dict[str, Any] = {}


def _rule_schema() -> dict[str, Any]:
    from . import schemas  # only a file that changed is validated

    if not _SCHEMA:
        _SCHEMA.update(schemas.rule_schema(LAYERS, _ID_RE.pattern))
    return _SCHEMA


def _check_advice(a: dict[str, Any], groups: set[str], path: str, label: str) -> None:
    """A suggested change: a parameter the tool knows (with a value where it needs one), and
    templates that name the pattern's own groups."""
    problem = param_problem(a["param"], "to" in a)
    _need(problem is None, path, label, "advice", problem or "")
    for key in ("to", "why"):
        for m in TEMPLATE_RE.finditer(str(a.get(key) or "")):
            _need(
                m.group("name") in groups,
                path,
                label,
                f"advice.{key}",
                f"{{{m.group('name')}}} is not a named group of the pattern",
            )


def parse_rule(
    raw: Any,
    path: str,
    index: int,
    trusted: bool = False,
    shipped: bool = False,
    known_engines: set[str] | None = None,
    layout: Layout | None = None,
) -> Rule:
    """Validate one rule mapping. Raises RuleError naming file, rule id and field. Its
    examples are split with `layout` (every engine profile's line layouts when None)."""
    if trusted and isinstance(raw, dict):
        # validated when it was cached (same path, size and mtime): only the engines, which
        # come from other files, are checked again
        check_engines(raw["engines"], path, raw["id"], known_engines)
        return _rule_from(raw, path, raw.get("class"), None, shipped)
    rid = raw.get("id") if isinstance(raw, dict) else None
    label = rid if isinstance(rid, str) else f"#{index + 1}"
    from .schemas import check

    check(raw, _rule_schema(), path, label)  # the shape: keys, types, the closed choices
    check_engines(raw["engines"], path, label, known_engines)
    compiled = compile_checked(raw["pattern"], path, label, trusted, shipped)
    groups = set(compiled.groupindex) if compiled is not None else _pattern_groups(raw["pattern"])
    for a in raw.get("advice") or []:
        _check_advice(a, groups, path, label)
    cls = raw.get("class")
    rule = _rule_from(raw, path, cls, compiled, shipped)
    if not trusted:
        problem = check_examples(rule, layout or shipped_layout())
        if problem:
            raise RuleError(path, label, problem[0], problem[1])
    return rule


def _rule_from(raw: dict[str, Any], path: str, cls: Any, compiled: Any, shipped: bool) -> Rule:
    ex = raw["examples"]
    return Rule(
        id=raw["id"],
        engines=list(raw["engines"]),
        cls=cls,
        severity=raw["severity"],
        needles=list(raw["needles"]),
        pattern=raw["pattern"],
        title=raw["title"].strip(),
        examples_match=list(ex["match"]),
        examples_no_match=list(ex["no_match"]),
        path=path,
        compiled=compiled,
        why=str(raw.get("why") or "").strip(),
        advice=[dict(a) for a in raw.get("advice") or []],
        consequence=raw.get("consequence", False),
        oom_phase=raw.get("oom_phase"),
        wraps_phase=raw.get("wraps_phase"),
        scope=raw.get("scope", "message"),
        shipped=shipped,
        layer=raw.get("layer", "rule"),
    )


_SHIPPED_LAYOUT: list[Layout] = []


def shipped_layout() -> Layout:
    """The line layouts of every shipped engine profile (for rules checked without a scan's),
    loaded once per process: a rule file's every rule asks for it."""
    if not _SHIPPED_LAYOUT:
        from .engine_profiles import load_profiles

        _SHIPPED_LAYOUT.append(load_profiles().layout)
    return _SHIPPED_LAYOUT[0]


def rule_matches_text(rule: Rule, text: str, layout: Layout) -> Any:
    """Would the scanner report this rule on this raw log line? (prefilter + pattern)"""
    line = layout.line("example", 1, text.encode("utf-8"))
    if not any(n in line.text for n in rule.needles):
        return None
    return rule.search(line.message if rule.scope == "message" else line.text)


def check_examples(rule: Rule, layout: Layout) -> tuple[str, str] | None:
    """A rule must match each of its match examples and none of its no_match ones."""
    for e in rule.examples_match:
        if not rule_matches_text(rule, e, layout):
            return "examples.match", f"pattern does not match its example: {e[:120]!r}"
    for e in rule.examples_no_match:
        if rule_matches_text(rule, e, layout):
            return "examples.no_match", f"pattern matches its no_match example: {e[:120]!r}"
    return None


@dataclass(slots=True)
class RuleSet:
    """Every usable rule, and the problems of those that were not."""

    rules: list[Rule]
    problems: list[str]  # one line per broken rule or file that was skipped

    def by_id(self, rid: str) -> Rule | None:
        for r in self.rules:
            if r.id == rid:
                return r
        return None


def load_rules(
    extra_dirs: list[str] | None = None,
    include_builtin: bool = True,
    known_engines: set[str] | None = None,
    layout: Layout | None = None,
) -> RuleSet:
    """Load every rule file; a broken rule is reported and skipped, the rest still used.

    `known_engines` (the engine profiles' names) is checked on every load, cached files too:
    a profile removed since makes its rules an error, not silence."""
    dirs: list[str] = []
    builtin = builtin_rules_dir()
    if include_builtin:
        dirs.append(builtin)
    dirs.extend(data_dirs(extra_dirs))
    rules: list[Rule] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    cache = data_cache()
    for d in dirs:
        if not os.path.isdir(d):
            problems.append(f"{d}: rules directory not found")
            continue
        for path in yaml_files(d):
            trusted, data = cache.get(path)
            if not trusted:
                try:
                    data = _load_yaml(path)
                except RuleError as e:
                    problems.append(str(e))
                    continue
            if data is None:
                continue
            if not isinstance(data, list):
                problems.append(f"{path}: a rule file must be a YAML list of rules")
                continue
            clean = True
            for i, raw in enumerate(data):
                try:
                    rule = parse_rule(raw, path, i, trusted, d == builtin, known_engines, layout)
                except (RuleError, UnicodeDecodeError) as e:
                    problems.append(str(e))
                    clean = False
                    continue
                if rule.id in seen:
                    problems.append(
                        f"{path}: rule {rule.id}: field 'id': duplicate (first in {seen[rule.id]})"
                    )
                    continue
                seen[rule.id] = path
                rules.append(rule)
            if clean and not trusted:
                cache.put(path, data)
    cache.save()
    return RuleSet(rules, problems)
