"""Engine profiles (data in rules/engines/): detection, version, phase markers, flag names.

A profile is a YAML mapping. Every marker carries needles (the literal prefilter), a
pattern and examples that the test suite runs, like the failure rules.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..base.data_files import builtin_rules_dir, data_dirs, yaml_files
from ..base.errors import RuleError
from ..base.validated_cache import data_cache
from ..base.validated_cache import load_yaml as _load_yaml
from ..model.records import OOM_PHASES, PHASES, Line
from ..read.prefixes import PREFIX_GROUPS, Layout
from ..search.patterns import PatternError, compile_checked, timed_pattern
from ..search.patterns import compile_pattern as _compile

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

PROFILE_KEYS = {
    "engine",
    "title",
    "detect",
    "variants",
    "version",
    "phases",
    "launch",
    "observe",
    "flags",
    "names",
    "defaults",
    "stack_hints",
    "prefixes",
    "advice",
    "units",
    "series",
    "memory",
    "metrics",
}
# What the sweep reads from a server's /metrics: each key of one vocabulary, from the engine's
# Prometheus sample names (summed over labels; kv_usage the fullest), or a ratio of two gauges
METRIC_KEYS = ("waiting", "running", "kv_usage", "preemptions")
# How an engine sizes its KV cache (`memory: kv_budget:`), which `plan` and `check` follow:
KV_BUDGETS = {
    "total": "a share of the GPU's total memory holds weights, activations and the KV cache (vLLM)",
    "free_static": "a share of the memory free at start holds the weights and the KV pool (SGLang)",
    "free_after_weights": "a share of what is free after the weights (and buffers) is the KV cache (LMDeploy, TensorRT-LLM)",
    "layers": "layers offloaded to the GPU and the context's KV cache beside them (Ollama, llama.cpp)",
}
# the closed choices of a profile's memory section (budget.EngineUnits says what each means)
MEMORY_CHOICES = {
    "context": ("per_sequence", "shared"),
    "model": ("vllm",),
    "profile": ("own", "dummy_batch"),
    "activations": ("in_rest", "before_share"),
}
# What a stats line can say (serving.py reads them): a share is 0..1 (`scale` turns a percent into one).
SERIES_FIELDS = {
    "prompt_tps": "prompt tokens per second",
    "gen_tps": "generated tokens per second",
    "running": "requests running",
    "waiting": "requests waiting in the queue",
    "swapped": "requests swapped out",
    "preemptions": "requests preempted since the last line",
    "kv_usage": "share of the KV cache in use",
    "prefix_hit": "prefix-cache hit rate",
}
SERIES_KEYS = {"needles", "fields", "examples", "why"}
LAUNCH_KINDS = {"python_call", "python_dict", "python_kwargs", "rust_debug", "command_line"}


@dataclass(slots=True)
class Marker:
    """A needle+pattern that tells something other than a failure."""

    engine: str
    what: str  # detect / variant / version / phase / launch
    needles: list[str]
    pattern: str
    compiled: Any
    examples: list[str]
    phase: str | None = None
    weight: int = 1
    variant: str | None = None
    kind: str | None = None  # launch parser kind
    repeat: bool = False  # observe: printed again and again (stats); the latest wins
    library: bool = False  # a runtime library's own line (NCCL, c10d): its phase in every engine
    # detect: a line only the engine's own entry point prints (its args dump, its version banner),
    # never a module another engine imports: it outranks any number of imported modules' lines
    own: bool = False
    path: str = ""
    shipped: bool = False  # from the package's own profiles: runs on `re` (patterns.py)

    def target(self, line: Line) -> str:
        # Detection looks at the whole line (process prefixes name the engine too).
        return line.text if self.what in ("detect", "variants") else line.message

    def search(self, text: str) -> Any:
        if self.compiled is None:  # validated earlier (cache): compiled on first use
            self.compiled = _compile(self.pattern, self.shipped, prefilter=False)
        return self.compiled.search(text)


@dataclass(slots=True)
class Profile:
    """One engine's profile (rules/engines/<engine>.yaml)."""

    engine: str
    title: str
    path: str
    markers: list[Marker] = field(default_factory=list)
    flags: dict[str, str] = field(default_factory=dict)  # canonical param -> engine flag
    names: dict[str, str] = field(default_factory=dict)  # engine launch key -> canonical
    defaults: dict[str, Any] = field(default_factory=dict)
    stack_hints: list[tuple[str, set[str]]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    advice: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # situation -> ordered steps
    units: dict[str, str] = field(default_factory=dict)  # canonical param -> what its value means here
    series: list[SeriesMarker] = field(default_factory=list)  # periodic stats lines
    # memory: kv_budget (a KV_BUDGETS key), package (the Python distribution whose installed
    # version is the engine's), launch (the command's head, `{model}` for the model)
    memory: dict[str, str] = field(default_factory=dict)
    prefixes: list[Any] = field(default_factory=list)  # the engine's line layouts (re.Pattern)
    # Prometheus: vocabulary key -> sample names, or {"ratio": [numerator, denominator]}
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class SeriesMarker:
    """A periodic stats line: every occurrence is a point of the serving series. Each field is
    read on its own, so the wordings of several versions (fields added, renamed, reordered)
    are one marker."""

    engine: str
    needles: list[str]
    fields: dict[str, tuple[str, float]]  # field -> (pattern with one group, scale)
    examples: list[str]
    shipped: bool = False
    compiled: dict[str, Any] = field(default_factory=dict)

    def read(self, text: str) -> dict[str, float]:
        if not self.compiled:
            # searched only in its own stats lines, where the fields are: no prefilter
            self.compiled = {
                k: _compile(p, self.shipped, prefilter=False) for k, (p, _) in self.fields.items()
            }
        out: dict[str, float] = {}
        for name, rx in self.compiled.items():
            m = rx.search(text)
            if m is not None:
                try:
                    out[name] = float(m.group(1).replace(",", "")) * self.fields[name][1]
                except ValueError:
                    continue
        return out


def _needles_of(raw: Any, path: str, label: str, allowed: set[str]) -> list[str]:
    """A marker's mapping checked for unknown keys, and its needles."""
    if not isinstance(raw, dict):
        raise RuleError(path, label, None, "must be a mapping")
    for k in raw:
        if k not in allowed:
            raise RuleError(path, label, str(k), f"unknown key (allowed: {', '.join(sorted(allowed))})")
    needles = raw.get("needles")
    if not (isinstance(needles, list) and needles and all(isinstance(n, str) and n for n in needles)):
        raise RuleError(path, label, "needles", "must be a non-empty list of strings")
    return needles


_SCHEMAS: dict[str, Any] = {}


def _schema(name: str) -> dict[str, Any]:
    """A profile part's JSON Schema (schemas.py), built once."""
    if name not in _SCHEMAS:
        from . import schemas

        if name == "memory":
            _SCHEMAS[name] = schemas.memory_schema(list(KV_BUDGETS), MEMORY_CHOICES)
        else:
            _SCHEMAS[name] = schemas.marker_schema(name.split(".")[1], PHASES, sorted(LAUNCH_KINDS))
    return _SCHEMAS[name]


def _marker(
    raw: Any,
    path: str,
    engine: str,
    what: str,
    i: int,
    layout: Layout,
    trusted: bool = False,
    shipped: bool = False,
) -> Marker:
    label = f"{engine}.{what}[{i}]"
    if not trusted:  # the shape: keys, types, the closed choices (a cached file passed it before)
        from .schemas import check

        check(raw, _schema(f"marker.{what}"), path, label)
    needles, pattern, examples = raw["needles"], raw["pattern"], raw["examples"]
    phase, kind = raw.get("phase"), raw.get("kind")
    # searched only on lines its own needles chose: looking for its literals first is only cost
    compiled = compile_checked(pattern, path, label, trusted, shipped, prefilter=False)
    m = Marker(
        engine=engine,
        what=what,
        needles=list(needles),
        pattern=pattern,
        compiled=compiled,
        examples=list(examples),
        phase=phase,
        weight=int(raw.get("weight", 1)),
        repeat=bool(raw.get("repeat", False)),
        library=bool(raw.get("library", False)),
        own=bool(raw.get("own", False)),
        variant=raw.get("variant"),
        kind=kind,
        path=path,
        shipped=shipped,
    )
    if trusted:
        return m
    for e in m.examples:
        line = layout.line("example", 1, e.encode())
        if not any(n in line.text for n in m.needles) or not m.search(m.target(line)):
            raise RuleError(path, label, "examples", f"pattern does not match its example: {e[:100]!r}")
    if what == "version" and compiled is not None and "version" not in compiled.groupindex:
        raise RuleError(path, label, "pattern", "needs a named group 'version'")
    return m


def _prefixes(raw: Any, path: str, engine: str, trusted: bool, shipped: bool) -> list[Any]:
    """The profile's line prefixes, compiled (anchored, one layer each): the shipped ones on `re`,
    a user's on `regex` under the pattern timeout (one that backtracks cannot hang a scan)."""
    import re

    if raw is None:
        return []
    if not isinstance(raw, list):
        raise RuleError(path, engine, "prefixes", "must be a list of {pattern, examples}")
    out = []
    for i, item in enumerate(raw):
        label = f"{engine}.prefixes[{i}]"
        if not (isinstance(item, dict) and isinstance(item.get("pattern"), str) and item["pattern"]):
            raise RuleError(path, label, "pattern", "missing")
        try:
            pat = re.compile(item["pattern"]) if shipped else timed_pattern(item["pattern"])
        except (re.error, PatternError) as e:
            raise RuleError(path, label, "pattern", f"does not compile: {e}") from None
        bad = set(pat.groupindex) - PREFIX_GROUPS
        if bad:
            raise RuleError(
                path,
                label,
                "pattern",
                f"unknown group {sorted(bad)[0]!r} (allowed: {', '.join(sorted(PREFIX_GROUPS))})",
            )
        examples = item.get("examples")
        if not (isinstance(examples, list) and examples and all(isinstance(e, str) for e in examples)):
            raise RuleError(path, label, "examples", "must be a non-empty list of log lines")
        if not trusted:
            for e in examples:
                m = pat.match(e)
                if not m or m.end() == 0:
                    raise RuleError(
                        path, label, "examples", f"pattern does not match the start of {e[:80]!r}"
                    )
        out.append(pat)
    return out


def _metrics(raw: Any, path: str, engine: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise RuleError(path, engine, "metrics", f"must map {', '.join(METRIC_KEYS)} to sample names")
    for key, names in raw.items():
        if key not in METRIC_KEYS:
            raise RuleError(path, engine, f"metrics.{key}", f"unknown key (known: {', '.join(METRIC_KEYS)})")
        ratio = names.get("ratio") if isinstance(names, dict) else None
        if isinstance(names, dict) and not (
            isinstance(ratio, list) and len(ratio) == 2 and all(isinstance(n, str) and n for n in ratio)
        ):
            raise RuleError(path, engine, f"metrics.{key}.ratio", "two sample names: numerator, denominator")
        if not isinstance(names, dict) and not (
            isinstance(names, list) and names and all(isinstance(n, str) and n for n in names)
        ):
            raise RuleError(
                path, engine, f"metrics.{key}", "a list of Prometheus sample names, or {ratio: [a, b]}"
            )
    return dict(raw)


def _advice_table(raw: Any, path: str, engine: str) -> dict[str, list[dict[str, Any]]]:
    """The engine's own order of candidates per situation (rules/advice/advice.yaml `steps` keys)."""
    from ..model.canonical_params import ADVICE_SITUATIONS, CANONICAL_PARAMS

    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise RuleError(path, engine, "advice", "must map a situation to a list of steps")
    out: dict[str, list[dict[str, Any]]] = {}
    for key, steps in raw.items():
        if key not in ADVICE_SITUATIONS:
            raise RuleError(
                path,
                engine,
                f"advice.{key}",
                f"unknown situation (known: {', '.join(sorted(ADVICE_SITUATIONS))})",
            )
        if not isinstance(steps, list) or not steps:
            raise RuleError(path, engine, f"advice.{key}", "must be a non-empty list of {param, note}")
        for st in steps:
            p = st.get("param") if isinstance(st, dict) else None
            if not isinstance(p, str) or not (
                p in CANONICAL_PARAMS or p.startswith("env:") or p == "limit_mm_per_prompt"
            ):
                raise RuleError(path, engine, f"advice.{key}", f"{p!r} is not a canonical parameter")
            if set(st) - {"param", "note", "above"}:
                raise RuleError(
                    path,
                    engine,
                    f"advice.{key}",
                    f"unknown key {sorted(set(st) - {'param', 'note', 'above'})[0]!r}",
                )
        out[str(key)] = [dict(st) for st in steps]
    return out


def parse_profile(data: Any, path: str, trusted: bool = False, shipped: bool = False) -> Profile:
    if not isinstance(data, dict):
        raise RuleError(path, None, None, "an engine profile must be a mapping")
    for k in data:
        if k not in PROFILE_KEYS:
            raise RuleError(path, None, str(k), f"unknown key (allowed: {', '.join(sorted(PROFILE_KEYS))})")
    engine = data.get("engine")
    if not isinstance(engine, str) or not engine:
        raise RuleError(path, None, "engine", "missing")
    prof = Profile(engine=engine, title=str(data.get("title") or engine), path=path)
    # the engine's line layouts first: its markers' examples are split with them
    prof.prefixes = _prefixes(data.get("prefixes"), path, engine, trusted, shipped)
    own_layout = Layout(prof.prefixes)
    for what in ("detect", "variants", "version", "phases", "launch", "observe"):
        items = data.get(what) or []
        if not isinstance(items, list):
            raise RuleError(path, engine, what, "must be a list")
        for i, raw in enumerate(items):
            try:
                prof.markers.append(_marker(raw, path, engine, what, i, own_layout, trusted, shipped))
            except RuleError as e:
                # one broken marker is reported and skipped; the rest of the profile still works
                prof.problems.append(str(e))
    for key in ("flags", "names", "defaults"):
        v = data.get(key) or {}
        if not isinstance(v, dict):
            raise RuleError(path, engine, key, "must be a mapping")
        setattr(prof, key, dict(v))
    prof.advice = _advice_table(data.get("advice"), path, engine)
    prof.metrics = _metrics(data.get("metrics"), path, engine)
    for i, raw in enumerate(data.get("series") or []):
        try:
            prof.series.append(_series_marker(raw, path, engine, i, trusted, shipped))
        except RuleError as e:
            prof.problems.append(str(e))
    memory = data.get("memory") or {}
    if not trusted:
        from .schemas import check

        check(memory, _schema("memory"), path, engine, at="memory")
    memory = {k: str(v) for k, v in memory.items()}  # reserve_gib is a number in YAML
    prof.memory = dict(memory)
    units = data.get("units") or {}
    if not (isinstance(units, dict) and all(isinstance(v, str) for v in units.values())):
        raise RuleError(path, engine, "units", "must map a canonical parameter to what its value means")
    prof.units = dict(units)
    hints = data.get("stack_hints") or []
    if not isinstance(hints, list):
        raise RuleError(path, engine, "stack_hints", "must be a list of {phase: [frame names]}")
    for h in hints:
        if not (isinstance(h, dict) and len(h) == 1):
            raise RuleError(path, engine, "stack_hints", "each entry is one {phase: [names]}")
        ((ph, names),) = h.items()
        if ph not in OOM_PHASES:
            raise RuleError(path, engine, "stack_hints", f"{ph!r} is not one of {OOM_PHASES}")
        prof.stack_hints.append((ph, {str(n) for n in names}))
    return prof


def _series_marker(raw: Any, path: str, engine: str, i: int, trusted: bool, shipped: bool) -> SeriesMarker:
    label = f"{engine}.series[{i}]"
    needles = _needles_of(raw, path, label, SERIES_KEYS)
    fields = raw.get("fields")
    if not (isinstance(fields, dict) and fields):
        raise RuleError(path, label, "fields", "must map a field to a pattern with one group")
    specs: dict[str, tuple[str, float]] = {}
    for name, spec in fields.items():
        where = f"fields.{name}"
        if name not in SERIES_FIELDS:
            raise RuleError(
                path, label, where, f"unknown field (allowed: {', '.join(sorted(SERIES_FIELDS))})"
            )
        pattern, scale = (spec.get("pattern"), spec.get("scale", 1)) if isinstance(spec, dict) else (spec, 1)
        if not isinstance(pattern, str) or not pattern:
            raise RuleError(path, label, where, "needs a pattern")
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale <= 0:
            raise RuleError(path, label, where, "scale must be a positive number")
        compiled = compile_checked(pattern, path, label, trusted, shipped, prefilter=False)
        if compiled is not None and compiled.groups != 1:
            raise RuleError(path, label, where, "the pattern needs exactly one group (the number)")
        specs[str(name)] = (pattern, float(scale))
    examples = raw.get("examples")
    if not (isinstance(examples, list) and examples and all(isinstance(e, str) for e in examples)):
        raise RuleError(path, label, "examples", "must be a non-empty list of log lines")
    sm = SeriesMarker(
        engine=engine, needles=list(needles), fields=specs, examples=list(examples), shipped=shipped
    )
    if trusted:
        return sm
    for ex in examples:
        if not any(n in ex for n in needles):
            raise RuleError(path, label, "examples", f"example has none of the needles: {ex[:80]!r}")
        if len(sm.read(ex)) < 2:
            raise RuleError(path, label, "examples", f"example gives fewer than two fields: {ex[:80]!r}")
    return sm


@dataclass(slots=True)
class Profiles:
    """Every engine's profile, and their line layouts together."""

    by_engine: dict[str, Profile]
    problems: list[str]
    layout: Layout  # every engine's line layouts (sorted by engine), for the scans to copy
    _markers: list[Marker] | None = None

    @property
    def markers(self) -> list[Marker]:
        """Every engine's markers: one list for the life of the profiles (the scans of a call
        share what they build from it)."""
        if self._markers is None:
            self._markers = [m for p in self.by_engine.values() for m in p.markers]
        return self._markers

    def get(self, engine: str) -> Profile:
        return self.by_engine.get(engine) or self.by_engine["generic"]

    @property
    def series(self) -> list[SeriesMarker]:
        return [s for p in self.by_engine.values() for s in p.series]

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """Every engine's /metrics vocabulary (the sweep does not know which engine answers)."""
        return [p.metrics for _, p in sorted(self.by_engine.items()) if p.metrics]


def load_profiles(extra_dirs: list[str] | None = None) -> Profiles:
    dirs = [os.path.join(builtin_rules_dir(), "engines")]
    dirs += [os.path.join(d, "engines") for d in data_dirs(extra_dirs)]
    out: dict[str, Profile] = {}
    problems: list[str] = []
    cache = data_cache()
    for d in dirs:
        if not os.path.isdir(d):
            continue
        for path in yaml_files(d):
            trusted, data = cache.get(path)
            try:
                if not trusted:
                    data = _load_yaml(path)
                prof = parse_profile(data, path, trusted, shipped=d == dirs[0])
            except RuleError as e:
                problems.append(str(e))
                continue
            out[prof.engine] = prof
            problems.extend(prof.problems)
            if not trusted and not prof.problems:
                cache.put(path, data)
    cache.save()
    if "generic" not in out:
        out["generic"] = Profile(engine="generic", title="generic", path="")
    layout = Layout([p for e in sorted(out) for p in out[e].prefixes])
    return Profiles(out, problems, layout)


def flag_for(profiles: Profiles, engine: str, param: str) -> str:
    """The engine's spelling of a canonical parameter (env vars and actions as they are)."""
    if param.startswith("env:"):
        return param[4:]
    if param.startswith("action:"):
        return param
    for name in (engine, "generic"):
        prof = profiles.by_engine.get(name)
        if prof and param in prof.flags:
            return prof.flags[param]
    return "--" + param.replace("_", "-")
