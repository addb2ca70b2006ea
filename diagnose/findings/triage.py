"""From rule hits to findings: class by rule, template or vocabulary, merging across ranks,
consequences, order, status.
"""

from __future__ import annotations

from dataclasses import replace

from ..knowledge.engine_profiles import Profiles
from ..match.hitbook import RecordedHit
from ..match.scanner import ScanResult
from ..model.records import CLASS_LAYER, Finding, PhaseMark, VocabHit
from ..model.taxonomy import TAXONOMY
from ..read.clock import seconds
from . import from_sources
from .oom_phase import evidence_lines, frames_of, oom_phase, uptime

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

    from ..model.records import Line

LAYER_ORDER = TAXONOMY.layers
CLASS_ORDER = TAXONOMY.class_order
SEVERITY_RANK = {"fatal": 0, "error": 1, "warning": 2, "info": 3}
MERGE_DISTANCE = 300  # hits of one class this close are one event (ranks, summary + traceback)


def _raised(rec: RecordedHit) -> list[tuple[Line, str]]:
    """(line, module that printed it): the exception line with the innermost frame's module,
    or an error line with its logger's own location ([arg_utils.py:1234], source=server.go:90)."""
    out = [
        (tb.exception, tb.innermost_file)
        for tb in (rec.tb, rec.near_tb)
        if tb is not None and tb.exception is not None and tb.innermost_file
    ]
    line = rec.hit.line
    if not out and line.location and rec.tb is None:
        out.append((line, line.location.rsplit(":", 1)[0]))
    return out


def _specificity(rec: RecordedHit) -> int:
    if rec.rule is None:
        return 0
    score = 1
    if "any" not in rec.rule.engines:
        score += 2
    if rec.rule.oom_phase:
        score += 1
    if any("to" in a for a in rec.rule.advice):
        score += 1  # a rule that names the value knows this message better
    return score


def pick_vocabulary(rec: RecordedHit) -> VocabHit | None:
    """The class words that best describe an unexplained error: those on its own exception
    line first, then those inside its traceback or after it, then those just before it;
    within each, in triage order (memory first), then the nearest."""
    own = {rec.hit.line.number}
    hits = list(rec.vocab)
    begin = rec.hit.line.number
    for tb in (rec.tb, rec.near_tb):
        if tb is not None:
            hits += tb.vocab
            begin = min(begin, tb.start.number)
            if tb.exception is not None:
                own.add(tb.exception.number)
    best: tuple[int, int, int] | None = None
    choice = None
    for v in hits:
        if v.cls == "unknown_error":
            continue
        n = v.line.number
        rank = 0 if n in own else 1 if n >= begin else 2
        key = (rank, CLASS_ORDER.index(v.cls), abs(n - rec.hit.line.number))
        if best is None or key < best:
            best, choice = key, v
    return choice


def build_findings(result: ScanResult, profiles: Profiles, engine: str) -> list[Finding]:
    """One finding per kept hit, its class read, its OOM typed, its restarts counted; what the
    server survived demoted; then merged across ranks and streams."""
    raw: list[tuple[RecordedHit, Finding]] = []
    counted = _counted(result)
    # lines a rule names (a cause, or another wrapper): a wrapper's traceback ending there is told
    explained = {(r.hit.line.source, r.hit.line.number) for r in counted if r.rule is not None}
    for rec in counted:
        f = _finding_of(rec, engine, explained)
        if f is None:
            continue
        if f.cls in ("oom", "kv_cache_too_small"):
            f.oom_phase, f.phase_inferred, f.phase_evidence = oom_phase(rec, f.cls, result, profiles, engine)
            up = uptime(rec, result) if f.oom_phase == "runtime" else None
            if up is not None:
                f.facts["uptime_s"] = up
        last_run, runs = result.earlier_runs, result.rule_runs.get(rec.hit.rule_id, 0)
        if last_run > 0 and rec.run == last_run and runs > 1:
            f.facts["runs"] = last_run + 1
            f.facts["runs_failed_alike"] = runs
            _add_note(f, f"the same failure in {runs} of {last_run + 1} runs (the server was restarted)")
        if (rec.rule is not None and rec.rule.severity == "info") or _names_itself(rec):
            raw.append((rec, _as_stop(f)))
            continue
        _demote_survived(f, rec, result)
        raw.append((rec, f))
    _quiet_after_stop(raw, result.earlier_runs)
    return _merge(raw)


def _counted(result: ScanResult) -> list[RecordedHit]:
    """The hits that make findings. A restart loop: earlier runs that failed the way the last
    one did are summarised on the last run's finding; of the other earlier failures, the
    latest of each rule is kept."""
    last_run = result.earlier_runs
    in_last = {rec.hit.rule_id for rec in result.hits if rec.run == last_run}
    latest_earlier: dict[str, int] = {}
    for rec in result.hits:
        if rec.run < last_run:
            latest_earlier[rec.hit.rule_id] = rec.run
    return [
        rec
        for rec in result.hits
        if not (rec.rule is not None and rec.rule.severity == "ignore")
        and not (
            rec.run < last_run
            and (rec.hit.rule_id in in_last or latest_earlier.get(rec.hit.rule_id) != rec.run)
        )
    ]


def _finding_of(rec: RecordedHit, engine: str, explained: set[tuple[str, int]]) -> Finding | None:
    """The hit as a finding with its class: the rule's, else the engine's own template's, the
    vocabulary's or the class table's; None for a line the engine prints as a mere warning."""
    rule, line = rec.rule, rec.hit.line
    f = Finding(
        rule=rec.hit.rule_id,
        cls=rule.cls if rule is not None and rule.cls else "unknown_error",
        severity=rule.severity if rule is not None else "fatal",
        title=rule.title if rule is not None else (rec.synthetic_title or "An error no rule explains"),
        line=line.number,
        source=line.source,
        evidence=line.message.strip() or line.text.strip(),
        facts=dict(rec.hit.facts),
        phase_at=rec.phase_at,
        time=line.timestamp or rec.last_time,
        ranks=[line.rank] if line.rank is not None else [],
        consequence=bool(rule.consequence) if rule is not None else False,
        frames=frames_of(rec),
        raised=next((x.message.strip() for x in evidence_lines(rec)[1:]), None),
    )
    # an error no rule names (a rule that chose unknown_error — a wrapper — keeps it)
    mined = from_sources.template_for(evidence_lines(rec), engine) if rule is None else None
    warned = mined is not None and not mined.template.is_error and rec.tb is None and rec.near_tb is None
    if warned and line.level != "CRITICAL":
        return None  # the engine prints this line itself as a warning: part of a healthy run
    if mined is not None and mined.cls != "unknown_error":
        if from_sources.apply_template(f, mined) == "request" and f.severity == "fatal":
            f.severity = "error"
    elif f.cls == "unknown_error":
        if mined is not None:
            f.facts["template"] = mined.template.id
        _read_unknown(f, rec, mined is None and rule is None, engine)
    if f.cls == "unknown_error" and rule is not None and rule.consequence:
        _wrapper_by_its_traceback(f, rec, engine, explained)
    return f


# The engines' request-intake functions (their sources' runtime roots on the request path:
# rules/mined, tools/mine/sources.yaml): a data error raised under one of them came in with a
# request, not from the server's own state.
REQUEST_INTAKE = frozenset(
    {
        "handle_generate_request",
        "handle_embedding_request",
        "process_input_requests",
        "generate_request",
        "create_chat_completion",
        "create_completion",
        "create_embedding",
        "_preprocess_chat",
        "_preprocess_completion",
        "v1_chat_completions",
        "v1_completions",
        "handle_completion_request",
        "handle_chat_completion_request",
        "add_request",
    }
)
# Exceptions a malformed or unexpected request input raises (Python's own data errors)
DATA_ERRORS = frozenset(
    {
        "TypeError",
        "KeyError",
        "ValueError",
        "IndexError",
        "AttributeError",
        "JSONDecodeError",
        "UnicodeDecodeError",
    }
)


def _wrapper_by_its_traceback(
    f: Finding, rec: RecordedHit, engine: str, explained: set[tuple[str, int]]
) -> None:
    """A wrapper ("scheduler died", "worker died") classed by the traceback of the process that
    died: the engine's template or class table on its exception, else a data error raised on the
    request-intake path is a request the server could not take."""
    tb = next((t for t in (rec.tb, rec.near_tb) if t is not None and t.exception is not None), None)
    if tb is None or tb.exception is None or (tb.exception.source, tb.exception.number) in explained:
        return  # no traceback to read, or a rule explains its exception: that finding is the cause
    exc = tb.exception
    mined = from_sources.template_for([exc], engine)
    if mined is not None and mined.cls not in ("unknown_error", None):
        from_sources.apply_template(f, mined)
    elif from_sources.apply_class_table(f, [(exc, tb.innermost_file or "")], engine) is None:
        name = from_sources.exception_type(exc.message)
        entry = next((fn for fn in tb.frames[0::2] if fn in REQUEST_INTAKE), None)
        if name not in DATA_ERRORS or entry is None:
            return
        f.cls, f.confidence, f.consequence = "request", "low", False
        f.title = "A request the server could not take crashed it"
        f.note = (
            f"{name} raised under {entry}, where the engine takes requests in: the input of one "
            "request, not the server's state, set it off"
        )
    # the process died of it (the wrapper says so): fatal whatever the class
    f.line, f.evidence, f.consequence = exc.number, exc.message.strip(), False


def _read_unknown(f: Finding, rec: RecordedHit, no_knowledge: bool, engine: str) -> None:
    """An error no rule or template classes: its class's vocabulary nearby, else the mined
    class table on what it raised (`no_knowledge`: neither a rule nor a template knows it)."""
    line = rec.hit.line
    vh = pick_vocabulary(rec)
    if vh is None and any(v.cls == "unknown_error" and v.line is line for v in rec.vocab):
        # "… crashed", "… died", "failed to start": a wrapper; its cause is printed before it
        f.consequence = True
    if vh is not None:
        f.cls = vh.cls
        f.rule, f.title, f.consequence, f.confidence = vh.rule_id, vh.title, False, "low"
        if f.cls == "request" and f.severity == "fatal":
            f.severity = "error"  # one request failed; the server is judged on the rest
        if vh.line.number != line.number and _is_exception_line(vh, rec):
            f.line, f.evidence = vh.line.number, vh.line.message.strip()
        f.facts["vocabulary_term"] = vh.term
        f.note = (
            f"recognised by the vocabulary of its class ({vh.term!r}, line {vh.line.number}): "
            "no specific rule knows this message, so this reading is less certain"
        )
    elif no_knowledge:
        from_sources.apply_class_table(f, _raised(rec), engine)


def _demote_survived(f: Finding, rec: RecordedHit, result: ScanResult) -> None:
    """An error the server got past (an earlier run, ready afterwards, serving went on) is a
    warning, with the reason said first. One this run got past before it became ready degrades
    nothing: the server never stopped on it."""
    line = rec.hit.line.number
    first_ready = next((m.line for m in result.timeline if m.phase == "ready"), None)
    later_progress = max([result.phase_last_line.get(p, 0) for p in ("ready", "serving")] or [0])
    severity = rec.rule.severity if rec.rule is not None else "fatal"
    later, before_ready = None, False
    if rec.run < result.earlier_runs:
        # a crash and a restart: the server as it runs now is degraded by its history
        later = f"from an earlier run; the server was restarted at line {result.run_start_line}"
    elif severity == "fatal" and first_ready is not None and first_ready > line:
        later, before_ready = f"the server still became ready afterwards (line {first_ready})", True
    elif rec.rule is None and later_progress > line and result.phase_last_line.get("ready") is not None:
        later = f"the server kept running afterwards (line {later_progress})"
    if later:
        f.severity = "warning"
        f.survived = before_ready
        _add_note(f, later, first=True)


def _add_note(f: Finding, text: str, first: bool = False) -> None:
    if not f.note:
        f.note = text
    else:
        f.note = f"{text}; {f.note}" if first else f"{f.note}; {text}"


def _names_itself(rec: RecordedHit) -> bool:
    """A server naming its own pid as the holder of its port: it is saying goodbye, not clashing."""
    holder = rec.hit.facts.get("holder_pid")
    return holder is not None and rec.hit.line.pid is not None and int(holder) == rec.hit.line.pid


def _as_stop(f: Finding) -> Finding:
    if f.cls != "stop":
        f.title = f"The server named itself at exit ({f.title.lower()}): a stop, not a clash"
        f.cls = "stop"
    f.severity = "info"
    f.consequence = False
    return f


def _quiet_after_stop(raw: list[tuple[RecordedHit, Finding]], last_run: int) -> None:
    """What a stopped server prints while it tears down (tracebacks, "engine dead", NCCL and
    port warnings) is part of the stop. A memory failure stays what it is, and anything
    before the stop, or in an earlier run, is untouched."""
    stops: dict[str, int] = {}
    for rec, f in raw:
        if f.cls == "stop" and rec.run == last_run:
            stops[f.source] = min(stops.get(f.source, f.line), f.line)
    if not stops:
        return
    for rec, f in raw:
        at = stops.get(f.source)
        if at is None or rec.run != last_run or f.cls == "stop" or f.line < at:
            continue
        if f.layer == "memory":
            continue
        f.severity = "info"
        _add_note(f, f"printed while the server stopped (line {at})", first=True)


def _is_exception_line(vh: VocabHit, rec: RecordedHit) -> bool:
    """Is the vocabulary's line the exception line of this error's traceback (a better evidence)?"""
    return any(
        tb is not None and tb.exception is not None and tb.exception.number == vh.line.number
        for tb in (rec.tb, rec.near_tb)
    )


def _merge(raw: list[tuple[RecordedHit, Finding]]) -> list[Finding]:
    """One finding per event: the same class on several ranks, or a summary line plus its traceback."""
    groups: list[list[tuple[RecordedHit, Finding]]] = []
    # a finding joins the first group (in the order they began) of its class, source and run
    # whose last line is near it: only the groups whose last line is in its stretch of
    # MERGE_DISTANCE lines or the two beside it are tried (a long log has thousands of
    # findings in hundreds of groups)
    near: dict[tuple[str, str, int, int], dict[int, list[tuple[RecordedHit, Finding]]]] = {}
    for rec, f in raw:
        stretch = f.line // MERGE_DISTANCE
        joined = None
        for i, g in sorted(
            item
            for s in (stretch - 1, stretch, stretch + 1)
            for item in near.get((f.cls, f.source, rec.run, s), {}).items()
        ):
            head = g[0][1]
            if abs(f.line - g[-1][1].line) <= MERGE_DISTANCE and (
                head.severity == f.severity or head.cls != "unknown_error"
            ):
                joined = i, g
                break
        if joined is None:
            i, g = len(groups), [(rec, f)]
            groups.append(g)
        else:
            i, g = joined
            del near[(f.cls, f.source, rec.run, g[-1][1].line // MERGE_DISTANCE)][i]
            g.append((rec, f))
        near.setdefault((f.cls, f.source, rec.run, stretch), {})[i] = g
    out: list[Finding] = []
    for g in groups:
        _best_rec, best = max(
            g, key=lambda rf: (-SEVERITY_RANK.get(rf[1].severity, 9), _specificity(rf[0]), -rf[1].line)
        )
        earliest = min(g, key=lambda rf: rf[1].line)[1]
        merged = replace(best, facts={})
        ranks: set[int] = set()
        merged.frames = []
        for _rec, f in sorted(g, key=lambda rf: -_specificity(rf[0])):
            for k, v in f.facts.items():
                merged.facts.setdefault(k, v)
            ranks.update(f.ranks)
            merged.frames.extend(f.frames)
        merged.ranks = sorted(ranks)
        merged.count = len(
            {(f.source, f.line) for _r, f in g}
        )  # lines, not rules: two rules on one line are one
        merged.severity = min((f.severity for _r, f in g), key=lambda s: SEVERITY_RANK.get(s, 9))
        merged.consequence = all(f.consequence for _r, f in g)
        if merged.oom_phase is None:
            merged.oom_phase = next((f.oom_phase for _r, f in g if f.oom_phase), None)
        if best.phase_inferred and earliest.oom_phase and not earliest.phase_inferred:
            merged.oom_phase, merged.phase_inferred = earliest.oom_phase, None
            merged.phase_evidence = earliest.phase_evidence
        out.append(merged)
    return out


def _sort_key(f: Finding) -> tuple[Any, ...]:
    return (
        SEVERITY_RANK.get(f.severity, 9),
        f.consequence,
        LAYER_ORDER.index(CLASS_LAYER[f.cls]),
        CLASS_ORDER.index(f.cls),
        f.line,
    )


def _after(f: Finding, g: Finding) -> bool:
    """Did f happen after g? The same file: by line; merged logs of one run: by their clocks
    (with no clock to tell, another rank's error is taken as following)."""
    if f.source == g.source:
        return f.line > g.line
    tf, tg = seconds(f.time), seconds(g.time)
    return tf is None or tg is None or tf >= tg


def order(findings: list[Finding]) -> list[Finding]:
    """Triage order, and errors that follow another cause marked as its consequences."""
    memory = [f for f in findings if f.layer == "memory" and f.severity == "fatal" and not f.consequence]
    first_memory = min(memory, key=lambda f: (seconds(f.time) or 0, f.line)) if memory else None
    named = [f for f in findings if f.cls not in ("unknown_error", "stop") and f.severity == "fatal"]
    for f in findings:
        if first_memory is not None and f.cls == "nccl" and f.severity == "fatal" and _after(f, first_memory):
            f.consequence = True
            f.note = f.note or f"follows the memory failure at {first_memory.source}:{first_memory.line}"
        if (
            f.cls == "unknown_error"
            and not f.consequence
            and f.rule == "generic.unexplained-error"
            and any(_after(f, g) for g in named)
        ):
            f.consequence = True
    return sorted(findings, key=_sort_key)


# Findings that do not make a running server degraded: a rejected request is the client's,
# and an exception the server carried on after is noise until it repeats into a failure.
NOT_DEGRADING = {"request", "unknown_error", "stop"}


def status_of(findings: list[Finding], timeline: list[PhaseMark]) -> str:
    if any(f.severity == "fatal" for f in findings):
        return "failed"
    if any(f.cls not in NOT_DEGRADING and f.severity != "info" and not f.survived for f in findings):
        return "degraded"
    if any(m.phase in ("ready", "serving") for m in timeline):
        return "ready"
    return "incomplete"
