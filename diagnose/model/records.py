"""The plain data every stage hands to the next: lines → hits → findings → diagnosis."""

from __future__ import annotations

from dataclasses import dataclass, field

from .taxonomy import TAXONOMY

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

# The failure taxonomy (DESIGN.md), read from rules/taxonomy/taxonomy.yaml: class -> layer, in triage
# order. Stable: JSON consumers depend on it. A class or phase is added in that file only.
CLASS_LAYER: dict[str, str] = TAXONOMY.class_layer
CLASSES = frozenset(CLASS_LAYER)

# Severities, most severe first. `info` findings are told but never change the status (a
# stop). `ignore` rules explain a line (so it is not an unknown error) but never become a
# finding: benign warnings.
SEVERITIES = ("fatal", "error", "warning", "info", "ignore")

# Canonical startup phases, in the order a healthy start passes them.
PHASES: tuple[str, ...] = TAXONOMY.phases
PHASE_INDEX = {p: i for i, p in enumerate(PHASES)}

OOM_PHASES: tuple[str, ...] = TAXONOMY.oom_phases


@dataclass(slots=True)
class Line:
    """One log line, with its origin and the fields split off its prefixes."""

    source: str
    number: int
    text: str  # decoded, ANSI-stripped, without the line ending
    message: str = ""  # text after all recognised prefixes
    level: str | None = None
    timestamp: str | None = None
    process: str | None = None  # e.g. "VllmWorker rank=3 pid=1090", "TP0"
    rank: int | None = None
    pid: int | None = None
    location: str | None = None  # e.g. "gpu_worker.py:276"
    truncated: bool = False

    @property
    def stream(self) -> str:
        """Which writer produced the line: tracebacks are grouped per stream."""
        if self.pid is not None:
            return f"pid={self.pid}"
        if self.process:
            return self.process
        if self.rank is not None:
            return f"rank{self.rank}"
        return ""

    @property
    def where(self) -> str:
        return f"{self.source}:{self.number}"


@dataclass(slots=True)
class PhaseMark:
    """A startup phase reached: where and when."""

    phase: str
    line: int
    time: str | None
    source: str = ""
    text: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.phase, "line": self.line, "time": self.time}


@dataclass(slots=True)
class Hit:
    """A rule matched a line."""

    rule_id: str
    line: Line
    facts: dict[str, Any]


@dataclass(slots=True)
class TracebackEvent:
    """A Python traceback folded into one event; its evidence is the exception line."""

    stream: str
    start: Line
    exception: Line | None  # None when the log ends inside the traceback
    frames: list[str]  # function names and file basenames, innermost last
    innermost_file: str = ""  # the innermost frame's path inside its package (vllm/config/model.py)
    explained: bool = False  # a rule matched inside it
    last_frame: int = 0  # line number of the latest frame line (the next one echoes its code)
    vocab: list[VocabHit] = field(default_factory=list)  # class words inside it
    # rule hits on the code a frame echoes (`raise X("…")`): kept only if the exception line
    # itself does not hit the same rule (then it is the evidence)
    echoed: list[Any] = field(default_factory=list)
    when: str | None = None  # the log's clock where it started (its start line may carry none)


@dataclass(slots=True)
class VocabHit:
    """A vocabulary term of some class on a line near an unexplained error."""

    rule_id: str
    cls: str
    title: str
    line: Line
    term: str


@dataclass(slots=True)
class Finding:
    """One event the log shows: its class, severity, evidence and facts."""

    rule: str
    cls: str
    severity: str
    title: str
    line: int
    source: str
    evidence: str
    facts: dict[str, Any] = field(default_factory=dict)
    oom_phase: str | None = None
    phase_inferred: str | None = None  # "stack" / "context" when not from the timeline
    phase_evidence: str | None = None  # what decided the OOM phase, in words
    phase_at: str | None = None  # last timeline phase before the finding
    time: str | None = None
    ranks: list[int] = field(default_factory=list)
    count: int = 1
    consequence: bool = False  # a symptom of another failure ("worker died")
    note: str | None = None
    frames: list[str] = field(default_factory=list)  # stack around it (for advice; not in JSON)
    raised: str | None = None  # its traceback's exception line, when not the evidence (advice; not in JSON)
    confidence: str | None = None  # "low": the class comes from the vocabulary, not a rule
    survived: bool = False  # this run got past it before it became ready: it degrades nothing

    @property
    def layer(self) -> str:
        return CLASS_LAYER[self.cls]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rule": self.rule,
            "class": self.cls,
            "layer": self.layer,
            "oom_phase": self.oom_phase,
            "severity": self.severity,
            "line": self.line,
            "evidence": self.evidence,
            "facts": self.facts,
        }
        # Extra keys after the schema-1 core; consumers ignore what they do not know.
        out["title"] = self.title
        out["source"] = self.source
        if self.time:
            out["time"] = self.time
        if self.phase_at:
            out["phase_at"] = self.phase_at
        if self.phase_inferred:
            out["oom_phase_from"] = self.phase_inferred
        if self.phase_evidence:
            out["oom_phase_evidence"] = self.phase_evidence
        if self.ranks:
            out["ranks"] = self.ranks
        if self.count > 1:
            out["count"] = self.count
        if self.consequence:
            out["consequence"] = True
        if self.note:
            out["note"] = self.note
        if self.confidence:
            out["confidence"] = self.confidence
        return out


@dataclass(slots=True)
class Change:
    """One concrete parameter change (the advice format of DESIGN.md)."""

    param: str
    flag: str
    to: str
    why: str
    verify: str
    frm: str | None = None
    named_by_engine: bool = False  # the engine's own message named this flag (not in JSON)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Change:
        return cls(d["param"], d["flag"], d["to"], d["why"], d["verify"], d.get("from"))

    def to_json(self) -> dict[str, Any]:
        return {
            "param": self.param,
            "flag": self.flag,
            "from": self.frm,
            "to": self.to,
            "why": self.why,
            "verify": self.verify,
        }


@dataclass(slots=True)
class EngineInfo:
    """The engine the log is from, and why that one."""

    name: str = "unknown"
    version: str | None = None
    variant: str | None = None
    reason: str | None = None  # why this engine was chosen (line or --engine)
    platform: str | None = None  # cuda, rocm, npu, xpu, mps, metal, vulkan, cpu: what the log names

    @property
    def label(self) -> str:
        """'vllm 0.8.5 (v1) on rocm' as a report's header says it."""
        return (
            self.name
            + (f" {self.version}" if self.version else "")
            + (f" ({self.variant})" if self.variant else "")
            + (f" on {self.platform}" if self.platform else "")
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "version": self.version, "variant": self.variant}
        if self.platform:
            out["platform"] = self.platform
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass(slots=True)
class Diagnosis:
    """The answer for one log: the JSON contract's record."""

    source: str
    engine: EngineInfo
    status: str  # failed / degraded / ready / incomplete
    last_phase: str | None
    primary: Finding | None
    findings: list[Finding]
    timeline: list[PhaseMark]
    launch: dict[str, Any]
    advice: list[Change] = field(default_factory=list)
    device: dict[str, Any] | None = None
    kb: list[dict[str, Any]] = field(default_factory=list)
    lines_read: int = 0
    unmatched_errors: int = 0
    serving: Any = None  # serving.Serving: the stats lines' series and verdict, when the log has them
    # how long the (last) startup and each phase took by the log's own timestamps (pipeline.durations)
    durations: dict[str, Any] | None = None
    # two engines' own lines in one log: two servers' lines merged (the verdict may mix them)
    two_servers: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        from .. import __version__

        return {
            "schema": 1,
            "source": self.source,
            "engine": self.engine.to_json(),
            "status": self.status,
            "last_phase": self.last_phase,
            "primary": self.primary.to_json() if self.primary else None,
            "findings": [f.to_json() for f in self.findings],
            "timeline": [m.to_json() for m in self.timeline],
            "launch": self.launch,
            "device": self.device,
            "advice": [c.to_json() for c in self.advice],
            "kb": self.kb,
            "serving": self.serving.to_json() if self.serving is not None else None,
            # additive to schema 1, after its keys
            "durations": self.durations,
            **({"two_servers": self.two_servers} if self.two_servers else {}),
            "diagnose_version": __version__,
        }
