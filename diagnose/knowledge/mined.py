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

from .mined_index import INDEX_SCHEMA, SEP, WORD, index_path_of, scan_store, unpack, word_index

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_LINE = 4096  # the part of a line templates are tried on (a line cut at 1 MiB is still one message)
ERROR_LEVELS = ("raise", "assert", "critical", "error")
# the engine every Python engine's log relays messages of
RELAYS = ("torch", "torch-npu", "triton", "flashinfer")


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


_ROW_PATTERNS = ("words", "module", "exc", "function")


class ClassTable:
    """rules/mined/classes.yaml: rows of conditions → class; parameter words → canonical name."""

    def __init__(self, data: dict[str, Any], path: str, validate: bool = True):
        self.path = path
        self.rows: list[dict[str, Any]] = []
        for i, row in enumerate(data.get("rows") or []):
            if not isinstance(row, dict) or "class" not in row or "id" not in row:
                raise ValueError(f"{path}: rows[{i}]: a row needs `id` and `class`")
            self.rows.append(dict(row, _index=i))
        self._params_src: dict[str, str] = dict(data.get("params") or {})
        self._params: list[tuple[str, re.Pattern[str]]] | None = None
        self.overrides: dict[str, dict[str, Any]] = {o["template"]: o for o in data.get("overrides") or []}
        self.module_phases: list[tuple[str, str]] = [
            (m["module"], m["phase"]) for m in data.get("module_phases") or []
        ]
        self._compiled: dict[tuple[int, str], re.Pattern[str]] = {}
        if validate:  # a changed file: every pattern now; a cached one compiles what it uses
            for row in self.rows:
                for key in _ROW_PATTERNS:
                    if key in row:
                        self._rx(row, key)
            _ = self.params

    @property
    def params(self) -> list[tuple[str, re.Pattern[str]]]:
        if self._params is None:
            try:
                self._params = [
                    (name, re.compile(rx, re.IGNORECASE)) for name, rx in self._params_src.items()
                ]
            except re.error as e:
                raise ValueError(f"{self.path}: params: {e}") from e
        return self._params

    def _rx(self, row: dict[str, Any], key: str) -> re.Pattern[str]:
        at = (row["_index"], key)
        rx = self._compiled.get(at)
        if rx is None:
            try:
                rx = self._compiled[at] = re.compile(row[key], re.IGNORECASE if key == "words" else 0)
            except re.error as e:
                raise ValueError(f"{self.path}: rows[{row['_index']}] ({row['id']}): field {key}: {e}") from e
        return rx

    def phase_of_module(self, module: str) -> str | None:
        """The phase of a module that serves one phase only (module_phases), for messages no
        mined call tree places (the Rust router's)."""
        for rx, phase in self.module_phases:
            if re.search(rx, module):
                return phase
        return None

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
            if "words" in row and not self._rx(row, "words").search(t.text):
                continue
            if "module" in row and not self._rx(row, "module").search(t.module):
                continue
            if "exc" in row and not self._rx(row, "exc").fullmatch(t.exc or ""):
                continue
            if "function" in row and not self._rx(row, "function").search(t.function):
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


MATCHES_KEPT = 256  # lines whose answers are kept (a line asked again is answered at once)
WORD_INDEX_AFTER = 4  # lines asked about before a file's literals are indexed by word (from the
# words its index ships, ~3 ms for vLLM's 15,000 literals; a line of substring tests is ~1.4 ms)


class Bundle:
    """One mined file: its literal index, frame phases and roots, read at once; a template's
    own record only when its literal is found in a line (the writer, tools/mine/store.py,
    puts one template on a line). Reading a whole 8 MB file into template objects cost
    ~0.15 s and 10 MB a file; the index costs a few ms and keeps memory flat."""

    def __init__(self, path: str):
        self.path = path
        self._loaded: dict[int, Template] = {}
        try:
            if not self._read_index(path):
                self._scan(path)
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            from ..base.errors import InputError

            raise InputError(f"{path}: not a mined-knowledge file ({e})") from e

    def _read_index(self, path: str) -> bool:
        """The index the miner writes beside the file (<source>.index.json): a few ms to read.
        False when it is missing or was written for another version of the file."""
        index_path = index_path_of(path)
        if not os.path.exists(index_path):
            return False
        with open(index_path, "rb") as f:
            idx = json.load(f)
        if idx.get("schema") != INDEX_SCHEMA or idx.get("size") != os.path.getsize(path):
            return False
        self._set(idx)
        return True

    def _set(self, idx: dict[str, Any]) -> None:
        self.engine: str = idx["engine"]
        self.source: str = idx["source"]
        self.versions: list[str] = list(idx.get("versions") or [])
        self._spans: tuple[list[int], list[int]] = (idx["frames_span"], idx["roots_span"])
        self._frames: dict[str, str] | None = None
        self._roots: dict[str, str] | None = None
        self._joined: str = idx["literals"]  # split on the first question (`rules list` asks none)
        self._split: list[str] | None = None
        self._starts = unpack(idx["starts"])
        self._offsets = unpack(idx["offsets"])
        n = self._joined.count(SEP) + 1 if self._joined else 0
        if len(self._starts) != n + 1 or self._starts[-1] != len(self._offsets):
            raise ValueError("its literal index does not add up")
        self._asked = 0
        self._by_word: tuple[dict[str, list[int]], list[int]] | None = None
        self._words: tuple[str, str] = (idx["words"], idx["word_of"])  # unpacked when asked

    @property
    def _literals(self) -> list[str]:
        if self._split is None:
            self._split = self._joined.split(SEP) if self._joined else []
        return self._split

    def _section(self, span: list[int]) -> dict[str, Any]:
        with open(self.path, "rb") as f:
            f.seek(span[0])
            return json.loads(b"{" + f.read(span[1] - span[0]) + b"}")  # type: ignore[no-any-return]

    @property
    def frames(self) -> dict[str, str]:
        """frame key (file stem:function) → the one phase whose call tree reaches it."""
        if self._frames is None:
            self._frames = self._section(self._spans[0])
        return self._frames

    @property
    def roots(self) -> dict[str, str]:
        """frame key → the phase it is a root of."""
        if self._roots is None:
            self._roots = {k: ph for ph, keys in self._section(self._spans[1]).items() for k in keys}
        return self._roots

    def _scan(self, path: str) -> None:
        self._set(scan_store(path))

    def _at(self, offset: int) -> Template:
        t = self._loaded.get(offset)
        if t is None:
            with open(self.path, "rb") as f:
                f.seek(offset)
                rec = json.loads(f.readline().rstrip().rstrip(b","))
            t = self._loaded[offset] = Template(rec, self.engine, self.source)
            if t.function:
                stem = t.module.rsplit("/", 1)[-1].removesuffix(".py")
                t.phase = self.frames.get(f"{stem}:{t.function.rsplit('.', 1)[-1]}")
        return t

    @property
    def count(self) -> int:
        """How many templates the file holds (from the index: none is read)."""
        return len(self._offsets)

    def _templates_of(self, i: int) -> list[Template]:
        """The templates whose longest literal is literal i."""
        return [self._at(o) for o in self._offsets[self._starts[i] : self._starts[i + 1]]]

    def by_id(self, template_id: str) -> Template | None:
        """One template by its id (`rules show`): its line found in the file, not every record read."""
        with open(self.path, "rb") as f:
            raw = f.read()
        at = raw.find(b'{"id": ' + json.dumps(template_id).encode() + b",")
        return self._at(raw.rfind(b"\n", 0, at) + 1) if at >= 0 else None

    @property
    def templates(self) -> list[Template]:
        """Every template (for the report tools and `rules show`; a scan never needs all)."""
        return [self._at(o) for o in self._offsets]

    def candidates(self, line: str) -> list[Template]:
        """Templates whose longest literal is in the line. A scan asks about a handful of lines
        (the errors no rule explains): a substring test per literal (~1 ms a line for a large
        file) beats building an automaton over them (~300 ms). A long log asks about many:
        after WORD_INDEX_AFTER lines, only the literals holding a word of the line are tried."""
        self._asked += 1
        lits = self._literals
        if self._asked < WORD_INDEX_AFTER:
            return [t for i, lit in enumerate(lits) if lit in line for t in self._templates_of(i)]
        if self._by_word is None:
            joined, word_of = self._words
            self._by_word = word_index(joined.split(SEP) if joined else [], unpack(word_of))
        by_word, always = self._by_word
        tried = {i for w in set(WORD.findall(line)) for i in by_word.get(w, ())}
        tried.update(always)
        return [t for i in sorted(tried) if lits[i] in line for t in self._templates_of(i)]


class MinedKnowledge:
    """The mined files of rules/mined, each read the first time its engine is asked about."""

    def __init__(self, directory: str):
        self.directory = directory
        names = (
            sorted(n for n in os.listdir(directory) if n.endswith(".json") and not n.endswith(".index.json"))
            if os.path.isdir(directory)
            else []
        )
        self.files = [n[: -len(".json")] for n in names]
        self._bundles: dict[str, Bundle] = {}
        self._answers: dict[tuple[str, str | None, bool], list[Match]] = {}
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
            {
                "id": "",
                "text": text,
                "pattern": "",
                "literal": "",
                "level": "raise",
                "exc": exc,
                "module": module,
            },
            engine,
            engine,
        )
        self.table.classify(t)
        return t if t.cls not in (None, "unknown_error") else None

    def match(self, text: str, engine: str | None = None, errors_only: bool = False) -> list[Match]:
        """Every template that explains the line, the most telling first: the detected engine's
        own and the relayed ones (torch) before other engines', then the longest literal.
        A line asked again (the same error on every rank, in every restart) is answered from
        the last MATCHES_KEPT answers."""
        line = text[:MAX_LINE]
        key = (line, engine, errors_only)
        known = self._answers.get(key)
        if known is None:
            known = self._answers[key] = self._match(line, engine, errors_only)
            if len(self._answers) > MATCHES_KEPT:
                del self._answers[next(iter(self._answers))]
        return list(known)

    def _match(self, line: str, engine: str | None, errors_only: bool) -> list[Match]:
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

    def function_phase(self, function: str, engine: str) -> str | None:
        """The phase whose call-tree roots name this function, in whichever module (an RPC a
        wrapper names: load_model, determine_num_available_blocks, execute_model); None when
        no root or several phases' roots have that name."""
        suffix = f":{function}"
        phases = {
            phase
            for b in self.bundles_for(engine)
            if b.engine == engine
            for key, phase in b.roots.items()
            if key.endswith(suffix)
        }
        return phases.pop() if len(phases) == 1 else None

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
    import on a scan, its patterns compiled on first use), else parsed and checked."""
    from ..base.validated_cache import load_validated

    def parse(data: Any, trusted: bool) -> ClassTable:
        try:
            return ClassTable(data if isinstance(data, dict) else {}, path, validate=not trusted)
        except ValueError as e:
            from ..base.errors import InputError

            raise InputError(str(e)) from e

    return load_validated(path, parse)


_knowledge: dict[str, MinedKnowledge] = {}


def knowledge(directory: str | None = None) -> MinedKnowledge:
    """The mined knowledge shipped with the rules (or in `directory`), read once per process."""
    if directory is None:
        from ..base.data_files import builtin_rules_dir

        directory = os.path.join(builtin_rules_dir(), "mined")
    k = _knowledge.get(directory)
    if k is None:
        k = _knowledge[directory] = MinedKnowledge(directory)
    return k
