"""Knowledge base of past incidents: a directory of YAML files, one incident each.

Every scan is compared with every incident: a fingerprint of finding classes, rule ids and
the masked templates of the evidence lines, scored with a similarity that weights rare
templates over common ones (IDF). Stores layer (a team's, a personal one, the starter set
shipped with the tool); writes are atomic and serialized by a lock.

Template mining: the evidence lines are already picked out by the rules, so a deterministic
mask (numbers, hex, paths, pids, times, quoted values) gives stable templates without the
persisted state of an online miner like Drain3 (whose last release is from 2022).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from ..base.atomic import atomic_write
from ..base.data_files import builtin_rules_dir, yaml_files
from ..base.errors import InputError
from ..base.redact import redact_tree  # one list for every output and the store
from ..base.validated_cache import DataCache, data_cache
from ..model.records import Diagnosis

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

MATCH_THRESHOLD = 0.5
STARTER_DISCOUNT = 0.9  # your own incidents rank above the starter set
KNOWN_KEYS = {
    "id",
    "title",
    "date",
    "engine",
    "engine_version",
    "model",
    "gpus",
    "symptom",
    "path",
    "root_cause",
    "fix",
    "tags",
    "fingerprint",
}


# --- masking and redaction --------------------------------------------------------------------

_MASKS = [
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?Z?\b"), "<time>"),
    (re.compile(r"\b\d{2}:\d{2}:\d{2}(?:\.\d+)?\b"), "<time>"),
    (re.compile(r"(?:/[\w.@+-]+)+/?"), "<path>"),
    (re.compile(r"\bpid[= ]\d+", re.I), "pid=<n>"),
    (re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-f]{12,}\b"), "<hex>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<str>"),
    (re.compile(r"\d+(?:[.,]\d+)*"), "<n>"),
]


def template(line: str) -> str:
    """An evidence line with everything that changes between incidents masked."""
    t = line.strip()
    for pat, repl in _MASKS:
        t = pat.sub(repl, t)
    return re.sub(r"\s+", " ", t)[:300]


# --- incidents ------------------------------------------------------------------------------


@dataclass(slots=True)
class Incident:
    """One past incident of a store."""

    data: dict[str, Any]
    path: str
    starter: bool = False
    _fingerprint: dict[str, list[str]] | None = None

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def title(self) -> str:
        return str(self.data["title"])

    @property
    def fingerprint(self) -> dict[str, list[str]]:
        """What recognising it compares (worked out once: a scan of many logs asks for each)."""
        if self._fingerprint is None:
            self._fingerprint = self._fingerprint_of_data()
        return self._fingerprint

    def _fingerprint_of_data(self) -> dict[str, list[str]]:
        fp = self.data.get("fingerprint") or {}
        sym = self.data.get("symptom") or {}
        phase = sym.get("oom_phase")
        return {
            "classes": list(fp.get("classes") or sym.get("classes") or []),
            "rules": list(fp.get("rules") or sym.get("rules") or []),
            "templates": list(fp.get("templates") or [template(e) for e in sym.get("evidence") or []]),
            "phases": list(fp.get("phases") or ([phase] if phase else [])),
        }

    def fix_text(self) -> str:
        fixes = self.data.get("fix") or []
        parts = []
        for f in fixes:
            if isinstance(f, dict):
                flag = f.get("flag") or f.get("param") or ""
                to = f.get("to")
                parts.append(f"{flag} {to}".strip() if to is not None and "=" not in str(flag) else str(flag))
            else:
                parts.append(str(f))
        return "; ".join(p for p in parts if p)


_SCHEMA: dict[str, Any] = {}


def validate(data: Any, path: str) -> dict[str, Any]:
    """The incident's shape by its JSON Schema (schemas.py), then its date: one-line errors
    naming the file and the field."""
    from ..knowledge.schemas import check, incident_schema

    if not _SCHEMA:
        _SCHEMA.update(incident_schema(KNOWN_KEYS))
    check(data, _SCHEMA, path, None)
    try:
        import datetime as dt  # validation runs only for files the cache does not hold

        dt.date.fromisoformat(str(data["date"])[:10])
    except ValueError:
        raise InputError(f"{path}: field 'date': {data['date']!r} is not YYYY-MM-DD") from None
    return data


def _read_incident(p: str, cache: DataCache) -> dict[str, Any]:
    """One incident file, validated; from the cache when unchanged since it last validated."""
    hit, data = cache.get(p)
    if hit:
        return data  # type: ignore[no-any-return]
    import yaml  # only for files the cache does not hold

    try:
        with open(p, encoding="utf-8") as f:
            data = validate(yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)), p)
    except yaml.YAMLError as e:
        from ..base.errors import yaml_problem

        raise InputError(f"{p}: not valid YAML: {yaml_problem(e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{p}: cannot read: {e}") from None
    cache.put(p, data)
    return data


def _dump(data: Any, sort_keys: bool = False) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=sort_keys, allow_unicode=True, width=100)  # type: ignore[no-any-return]


# Paths here are strings (os.path): the store is read on every failed scan, and pathlib's
# import costs more than the reading.


def starter_dir() -> str:
    return os.path.join(builtin_rules_dir(), "kb")


def default_store() -> str:
    env = os.environ.get("DIAGNOSE_KB")
    if env:
        return os.path.normpath(env.split(os.pathsep)[0])
    from ..base.userdirs import user_data_dir

    return os.path.join(user_data_dir(), "kb")


def store_dirs(explicit: list[str] | None = None) -> list[str]:
    """Writable-first list of stores: --kb DIRs, else DIAGNOSE_KB (os.pathsep list), else the user's."""
    if explicit:
        return [os.path.normpath(d) for d in explicit]
    env = os.environ.get("DIAGNOSE_KB")
    if env:
        return [os.path.normpath(d) for d in env.split(os.pathsep) if d]
    return [default_store()]


@dataclass(slots=True)
class KnowledgeBase:
    """The incidents of every store, and how a diagnosis matches them."""

    incidents: list[Incident] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    _idf_of: dict[str, float] | None = None  # worked out on the first match

    @classmethod
    def load(cls, dirs: list[str], starter: bool = True) -> KnowledgeBase:
        kb = cls()
        cache = data_cache()
        seen: set[str] = set()
        layers = [(d, False) for d in dirs] + ([(starter_dir(), True)] if starter else [])
        for d, is_starter in layers:
            d = os.fspath(d)
            if not os.path.isdir(d):
                continue
            for p in yaml_files(d):
                try:
                    data = _read_incident(p, cache)
                except InputError as e:
                    kb.problems.append(str(e))
                    continue
                key = f"{d}:{data['id']}"
                if key in seen:
                    kb.problems.append(f"{p}: field 'id': {data['id']} appears twice in {d}")
                    continue
                seen.add(key)
                kb.incidents.append(Incident(data, p, is_starter))
        cache.save()
        return kb

    def get(self, iid: str) -> Incident | None:
        return next((i for i in self.incidents if i.id == iid and not i.starter), None) or next(
            (i for i in self.incidents if i.id == iid), None
        )

    def search(self, text: str) -> list[Incident]:
        words = text.lower().split()
        out = []
        for inc in self.incidents:
            blob = _dump(inc.data, sort_keys=True).lower()
            if all(w in blob for w in words):
                out.append(inc)
        return out

    # --- recognition -------------------------------------------------------------------------

    def _idf(self) -> dict[str, float]:
        if self._idf_of is None:
            self._idf_of = self._idf_now()
        return self._idf_of

    def _idf_now(self) -> dict[str, float]:
        df: dict[str, int] = {}
        for inc in self.incidents:
            for t in set(inc.fingerprint["templates"]):
                df[t] = df.get(t, 0) + 1
        n = max(1, len(self.incidents))
        return {t: math.log(1 + n / c) for t, c in df.items()}

    def match(self, d: Diagnosis, threshold: float = MATCH_THRESHOLD, limit: int = 3) -> list[dict[str, Any]]:
        probe_fp = fingerprint_of(d)
        if not probe_fp["classes"]:
            return []
        idf = self._idf()
        default_idf = math.log(1 + max(1, len(self.incidents)))  # a template no incident has: rare
        scored = []
        for inc in self.incidents:
            if not same_failure(d, inc.fingerprint):
                continue  # text alike but another failure: a match that would mislead
            # a starter incident is a family (several rules, several wordings): how much of this log
            # it covers; your own incidents are one event each: how alike the two are
            s = similarity(probe_fp, inc.fingerprint, idf, default_idf, coverage=inc.starter)
            if inc.starter:
                s *= STARTER_DISCOUNT
            if s >= threshold:
                scored.append((s, inc))
        scored.sort(key=lambda x: (-x[0], x[1].starter, x[1].id))
        return [
            {
                "id": inc.id,
                "score": round(s, 3),
                "title": inc.title,
                "date": str(inc.data.get("date")),
                "root_cause": inc.data.get("root_cause"),
                "fix": inc.data.get("fix") or [],
                "fix_text": inc.fix_text(),
                "starter": inc.starter,
            }
            for s, inc in scored[:limit]
        ]


def fingerprint_of(d: Diagnosis) -> dict[str, list[str]]:
    fs = [
        f for f in d.findings if f.severity in ("fatal", "error", "warning") and not f.consequence
    ] or d.findings
    return {
        "classes": sorted({f.cls for f in fs}),
        "rules": sorted({f.rule for f in fs}),
        "templates": sorted({template(f.evidence) for f in fs[:5]}),
        "phases": sorted({f.oom_phase for f in fs if f.oom_phase}),
    }


def same_failure(d: Diagnosis, fp: dict[str, list[str]]) -> bool:
    """An incident can only be this failure again if it has the same class, and for an OOM
    the same phase: a CUDA-graph OOM is no precedent for a weight-loading one."""
    p = d.primary
    if p is None:
        return False
    if p.cls not in fp.get("classes", []):
        return False
    return not p.oom_phase or p.oom_phase in fp.get("phases", [])


def similarity(
    a: dict[str, list[str]],
    b: dict[str, list[str]],
    idf: dict[str, float],
    default_idf: float,
    coverage: bool = False,
) -> float:
    """Weighted Jaccard (or, with coverage, the share of `a` that `b` holds): classes weigh 1,
    OOM phases and rule ids 2, templates 1 + their IDF (rare ones more)."""

    def weights(fp: dict[str, list[str]]) -> dict[str, float]:
        w: dict[str, float] = {}
        for c in fp["classes"]:
            w["c:" + c] = 1.0
        for r in fp["rules"]:
            w["r:" + r] = 2.0
        for ph in fp.get("phases", []):
            w["p:" + ph] = 2.0
        for t in fp["templates"]:
            w["t:" + t] = 1.0 + idf.get(t, default_idf)
        return w

    wa, wb = weights(a), weights(b)
    if not wa or not wb:
        return 0.0
    inter = sum(min(wa[k], wb[k]) for k in wa.keys() & wb.keys())
    if coverage:
        return inter / sum(wa.values())
    union = sum(max(wa.get(k, 0), wb.get(k, 0)) for k in wa.keys() | wb.keys())
    return inter / union if union else 0.0


# --- writing --------------------------------------------------------------------------------


class locked:
    """An exclusive lock on the store (filelock: the same on Linux, macOS and Windows):
    concurrent `kb add` runs take turns, none is lost."""

    def __init__(self, store: str):
        from filelock import FileLock  # only a write to the store pays for it

        if os.path.exists(store) and not os.path.isdir(store):
            raise InputError(
                f"{store}: the incident store must be a directory (--kb / DIAGNOSE_KB), not a file"
            )
        self.store = store
        self._lock = FileLock(os.path.join(store, ".lock"))

    def __enter__(self) -> None:
        try:
            os.makedirs(self.store, exist_ok=True)
            self._lock.acquire()
        except OSError as e:
            raise InputError(f"{self.store}: cannot write the incident store: {e.strerror or e}") from None

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def next_id(store: str) -> str:
    nums = [int(m.group(1)) for n in os.listdir(store) if (m := re.match(r"KB-(\d+)\.yaml$", n))]
    return f"KB-{(max(nums) + 1 if nums else 1):04d}"


def _content(data: dict[str, Any]) -> str:
    """What makes two incidents the same one, whatever id or file they carry."""
    import json

    return json.dumps({k: v for k, v in data.items() if k not in ("id",)}, sort_keys=True, default=str)


def existing_copy(store: str, data: dict[str, Any]) -> str | None:
    """The id of an incident in the store with exactly this content (an import done twice)."""
    import yaml

    want = _content(data)
    for path in yaml_files(store):
        try:
            with open(path, encoding="utf-8") as f:
                doc = yaml.safe_load(f)
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and _content(doc) == want:
            return str(doc.get("id") or os.path.basename(path)[:-5])
    return None


def add_incident(
    store: str | os.PathLike[str], data: dict[str, Any], skip_copies: bool = False
) -> tuple[str, dict[str, int]]:
    """Redact, fingerprint, validate and write one incident under a fresh id (with
    `skip_copies`, an incident already stored with the same content keeps its id: `kb import`
    of one bundle twice adds nothing the second time)."""
    store = os.fspath(store)
    found: dict[str, int] = {}
    data = redact_tree(data, found)
    with locked(store):
        if skip_copies:
            same = existing_copy(store, data)
            if same is not None:
                return same, found
        iid = next_id(store)
        data = {"id": iid, **{k: v for k, v in data.items() if k != "id"}}
        path = os.path.join(store, f"{iid}.yaml")
        validate(data, path)
        try:
            atomic_write(path, _dump(data))
        except OSError as e:
            raise InputError(f"{path}: cannot write the incident: {e.strerror or e}") from None
    return iid, found


def incident_from(
    d: Diagnosis,
    root_cause: str,
    fix: list[str] | None,
    path: list[str] | None,
    title: str | None = None,
    tags: list[str] | None = None,
) -> dict[str, Any]:
    import datetime as dt

    p = d.primary
    fixes: list[Any] = []
    for f in fix or []:
        fixes.append({"flag": f})
    if not fixes and d.advice:
        c = d.advice[0]
        fixes.append({"param": c.param, "flag": c.flag, "from": c.frm, "to": c.to})
    fp = fingerprint_of(d)
    return {
        "title": title or (p.title if p else f"{d.status} log"),
        "date": dt.date.today().isoformat(),
        "engine": d.engine.name,
        "engine_version": d.engine.version,
        "model": d.launch.get("model"),
        "gpus": d.device["summary"] if d.device else None,
        "symptom": {
            "classes": fp["classes"],
            "rules": fp["rules"],
            "oom_phase": p.oom_phase if p else None,
            "evidence": [f.evidence for f in d.findings[:5]],
        },
        "path": list(path or []),
        "root_cause": root_cause,
        "fix": fixes,
        "tags": list(tags or []),
        "fingerprint": fp,
    }


def diagnosis_from_json(doc: dict[str, Any]) -> Diagnosis:
    """A schema-1 report (scan --json) back into the fields an incident needs."""
    from ..model.records import Change, EngineInfo, Finding

    if not isinstance(doc, dict) or doc.get("schema") != 1:
        raise InputError(
            "not a schema-1 diagnosis (make it with: diagnose scan --json serve.log > report.json)"
        )

    def finding(x: dict[str, Any]) -> Finding:
        return Finding(
            rule=x.get("rule", "?"),
            cls=x.get("class", "unknown_error"),
            severity=x.get("severity", "fatal"),
            title=x.get("title", ""),
            line=x.get("line") or 0,
            source=x.get("source", ""),
            evidence=x.get("evidence", ""),
            facts=x.get("facts") or {},
            oom_phase=x.get("oom_phase"),
            consequence=bool(x.get("consequence")),
        )

    try:
        findings = [finding(x) for x in doc.get("findings") or []]
        primary = finding(doc["primary"]) if doc.get("primary") else None
        eng = doc.get("engine") or {}
        advice = [
            Change(
                param=a["param"],
                flag=a.get("flag", ""),
                to=str(a.get("to")),
                why=a.get("why", ""),
                verify=a.get("verify", ""),
                frm=a.get("from"),
            )
            for a in doc.get("advice") or []
        ]
    except (KeyError, TypeError, AttributeError) as e:
        raise InputError(f"the report is not a valid schema-1 diagnosis: {e}") from None
    return Diagnosis(
        source=doc.get("source", ""),
        engine=EngineInfo(eng.get("name", "generic"), eng.get("version"), eng.get("variant")),
        status=doc.get("status", "failed"),
        last_phase=doc.get("last_phase"),
        primary=primary,
        findings=findings,
        timeline=[],
        launch=doc.get("launch") or {},
        advice=advice,
        device=doc.get("device"),
    )
