"""What the engines' own sources know: mined message templates and frame phases.

`rules/mined/<source>.json` is written by `python -m tools.mine` (see tools/mine): every
message an engine can print (the format string as a pattern, its level, exception type,
module, function and the versions that print it) and, for the Python engines, the one
phase each function's call tree belongs to. `classes.yaml` beside them gives a template its
class by a small table. Nothing here runs for a log whose findings rules already explain:
the files are read on the first question, once per process.
"""

from __future__ import annotations

import json
import os
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_LINE = 4096  # the part of a line templates are tried on (a line cut at 1 MiB is still one message)
ERROR_LEVELS = ("raise", "assert", "critical", "error")
# the engine every Python engine's log relays messages of
RELAYS = ("torch",)


class Template:
    __slots__ = (
        "_rx",
        "cls",
        "engine",
        "exc",
        "function",
        "id",
        "level",
        "literal",
        "module",
        "param",
        "pattern",
        "phase",
        "row",
        "source",
        "text",
        "versions",
    )

    def __init__(self, rec: dict[str, Any], engine: str, source: str):
        self.id: str = rec["id"]
        self.text: str = rec["text"]
        self.pattern: str = rec["pattern"]
        self.literal: str = rec["literal"]
        self.level: str = rec["level"]
        self.exc: str = rec.get("exc", "")
        self.module: str = rec.get("module", "")
        self.function: str = rec.get("function", "")
        self.versions: str = rec.get("versions", "")
        self.engine = engine
        self.source = source
        self.cls: str | None = None  # filled by the class table on first use
        self.param: str | None = None
        self.row: str | None = None
        self.phase: str | None = None  # the phase of the function that prints it, when mined
        self._rx: re.Pattern[str] | None = None

    def search(self, text: str) -> re.Match[str] | None:
        if self._rx is None:
            self._rx = re.compile(self.pattern)
        return self._rx.search(text)

    @property
    def is_error(self) -> bool:
        return self.level in ERROR_LEVELS


class Match:
    """A line that a mined template explains: the template, its class and what it captured."""

    __slots__ = ("captures", "template")

    def __init__(self, template: Template, captures: dict[str, str]):
        self.template = template
        self.captures = captures

    @property
    def cls(self) -> str:
        return self.template.cls or "unknown_error"


class ClassTable:
    """rules/mined/classes.yaml: rows of conditions → class; parameter words → canonical name."""

    def __init__(self, data: dict[str, Any], path: str):
        self.rows: list[dict[str, Any]] = []
        for i, row in enumerate(data.get("rows") or []):
            where = f"{path}: rows[{i}] ({row.get('id', '?')})"
            if not isinstance(row, dict) or "class" not in row or "id" not in row:
                raise ValueError(f"{where}: a row needs `id` and `class`")
            compiled = dict(row)
            for key in ("words", "module", "exc", "function"):
                if key in row:
                    try:
                        compiled[key] = re.compile(row[key], re.IGNORECASE if key == "words" else 0)
                    except re.error as e:
                        raise ValueError(f"{where}: field {key}: {e}") from e
            self.rows.append(compiled)
        self.params: list[tuple[str, re.Pattern[str]]] = [
            (name, re.compile(rx, re.IGNORECASE)) for name, rx in (data.get("params") or {}).items()
        ]
        self.overrides: dict[str, dict[str, Any]] = {o["template"]: o for o in data.get("overrides") or []}

    def param_of(self, text: str) -> str | None:
        best: tuple[int, str] | None = None
        for name, rx in self.params:
            m = rx.search(text)
            if m is not None and (best is None or m.start() < best[0]):
                best = (m.start(), name)
        return best[1] if best else None

    def classify(self, t: Template) -> None:
        t.param = self.param_of(t.text)
        over = self.overrides.get(t.id)
        if over is not None:
            t.cls, t.row = over["class"], "override"
            t.param = over.get("param", t.param)
            return
        for row in self.rows:
            if "levels" in row and t.level not in row["levels"]:
                continue
            if "words" in row and not row["words"].search(t.text):
                continue
            if "module" in row and not row["module"].search(t.module):
                continue
            if "exc" in row and not row["exc"].fullmatch(t.exc or ""):
                continue
            if "function" in row and not row["function"].search(t.function):
                continue
            if row.get("needs_param") and t.param is None:
                continue
            if t.phase and t.phase in row.get("not_phases", ()):
                continue
            if "phases" in row and t.phase not in row["phases"]:
                continue
            t.cls, t.row = row["class"], row["id"]
            return
        t.cls, t.row = "unknown_error", None


class Bundle:
    """One mined file's templates (indexed by their longest literal) and frame phases."""

    def __init__(self, path: str):
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            self.engine: str = data["engine"]
            self.source: str = data["source"]
            self.versions: list[str] = list(data.get("versions") or [])
            recs = data["templates"]
            self.frames: dict[str, str] = dict(data.get("frames") or {})
            self.roots: dict[str, str] = {k: ph for ph, keys in (data.get("roots") or {}).items() for k in keys}
            self.templates = [Template(rec, self.engine, self.source) for rec in recs]
            for t in self.templates:
                if t.function:
                    stem = t.module.rsplit("/", 1)[-1].removesuffix(".py")
                    t.phase = self.frames.get(f"{stem}:{t.function.rsplit('.', 1)[-1]}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            from .errors import InputError

            raise InputError(f"{path}: not a mined-knowledge file ({e})") from e
        self._by_literal: dict[str, list[Template]] = {}
        for t in self.templates:
            self._by_literal.setdefault(t.literal, []).append(t)

    def candidates(self, line: str) -> list[Template]:
        """Templates whose longest literal is in the line. A scan asks about a handful of lines
        (the errors no rule explains), so a substring test per literal (~2 ms a line) beats
        building an automaton over them (~300 ms)."""
        return [t for lit, ts in self._by_literal.items() if lit in line for t in ts]


class MinedKnowledge:
    """The mined files of rules/mined, each read the first time its engine is asked about."""

    def __init__(self, directory: str):
        self.directory = directory
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json")) if os.path.isdir(directory) else []
        self.files = [n[: -len(".json")] for n in names]
        self._bundles: dict[str, Bundle] = {}
        table_path = os.path.join(directory, "classes.yaml")
        self.table = _load_table(table_path) if os.path.exists(table_path) else None

    def bundle(self, name: str) -> Bundle:
        b = self._bundles.get(name)
        if b is None:
            b = self._bundles[name] = Bundle(os.path.join(self.directory, name + ".json"))
        return b

    def bundles_for(self, engine: str | None) -> list[Bundle]:
        """The engine's own files (vllm: vllm, vllm-ascend) and the relayed ones; every file
        when the engine is not known."""
        if engine in (None, "generic"):
            return [self.bundle(n) for n in self.files]
        names = [n for n in self.files if n == engine or n.startswith(engine + "-") or n in RELAYS]
        names.sort(key=lambda n: (n != engine, n))  # the engine's own file first: its versions speak
        return [self.bundle(n) for n in names]

    def classified(self, t: Template) -> Template:
        if t.row is None and t.cls is None and self.table is not None:
            self.table.classify(t)
        return t

    def classify_line(self, text: str, exc: str, module: str, engine: str) -> Template | None:
        """The class table applied to a line no template knows (a message newer than the mined
        versions): its words, its exception type and the module of the frame that raised it."""
        if self.table is None:
            return None
        t = Template(
            {"id": "", "text": text, "pattern": "", "literal": "", "level": "raise", "exc": exc, "module": module},
            engine,
            engine,
        )
        self.table.classify(t)
        return t if t.cls not in (None, "unknown_error") else None

    def match(self, text: str, engine: str | None = None, errors_only: bool = False) -> list[Match]:
        """Every template that explains the line, the most telling first: the detected engine's
        own and the relayed ones (torch) before other engines', then the longest literal."""
        line = text[:MAX_LINE]
        out: list[Match] = []
        seen: set[str] = set()
        for b in self.bundles_for(engine):
            for t in b.candidates(line):
                if t.id in seen:
                    continue  # vllm and vllm-ascend share vLLM's own messages
                seen.add(t.id)
                if errors_only and not t.is_error:
                    continue
                m = t.search(line)
                if m is not None:
                    caps = {k: v for k, v in m.groupdict().items() if v}
                    out.append(Match(self.classified(t), caps))

        def rank(mt: Match) -> tuple[int, int, int]:
            t = mt.template
            own = 0 if t.engine == engine else 1 if t.engine in RELAYS else 2
            literal = len(_HOLE.sub("", t.text))
            return (own, -literal, 0 if t.is_error else 1)

        out.sort(key=rank)
        return out

    def frame_phase(self, frames: list[str], engine: str) -> tuple[str, str] | None:
        """(phase, frame) from the engine's mined call trees. `frames` alternates function and
        file stem, outermost first, as the matcher keeps them. The outermost frame that is a
        phase's own root decides (a dispatcher above it — a worker's RPC loop — runs every
        phase); without a root in view (a pasted tail), the phases of the frames vote and a tie
        goes to the innermost. Sources that disagree on a frame give it no phase."""
        bundles = [b for b in self.bundles_for(engine) if b.frames and b.engine == engine]
        if not bundles:
            return None
        votes: list[tuple[str, str]] = []
        for i in range(0, len(frames) - 1, 2):
            key = f"{frames[i + 1]}:{frames[i]}"
            shown = f"{frames[i + 1]}.{frames[i]}"
            roots = {b.roots[key] for b in bundles if key in b.roots}
            if len(roots) == 1:
                return roots.pop(), shown
            phases = {b.frames[key] for b in bundles if key in b.frames}
            if len(phases) == 1:
                votes.append((phases.pop(), shown))
        if not votes:
            return None
        counts: dict[str, int] = {}
        for ph, _ in votes:
            counts[ph] = counts.get(ph, 0) + 1
        top = max(counts.values())
        return next((ph, shown) for ph, shown in reversed(votes) if counts[ph] == top)


_HOLE = re.compile(r"\{[^{}]*\}")  # a placeholder in a template's text


def _load_table(path: str) -> ClassTable:
    """The class table, from the validated-data cache when the file is unchanged (no YAML
    import on a scan), else parsed, checked and cached."""
    from .datacache import data_cache

    cache = data_cache()
    trusted, data = cache.get(path)
    if not trusted:
        data = _load_yaml(path)
    try:
        table = ClassTable(data, path)
    except ValueError as e:
        from .errors import InputError

        raise InputError(str(e)) from e
    if not trusted:
        cache.put(path, data)
        cache.save()
    return table


def _load_yaml(path: str) -> dict[str, Any]:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError) as e:
        from .errors import InputError

        raise InputError(f"{path}: {e}") from e
    return data if isinstance(data, dict) else {}


_knowledge: dict[str, MinedKnowledge] = {}


def knowledge(directory: str | None = None) -> MinedKnowledge:
    """The mined knowledge shipped with the rules (or in `directory`), read once per process."""
    if directory is None:
        from .rules import builtin_rules_dir

        directory = os.path.join(builtin_rules_dir(), "mined")
    k = _knowledge.get(directory)
    if k is None:
        k = _knowledge[directory] = MinedKnowledge(directory)
    return k
