"""One diagnosis as a line of stages, each a function from one record to the next, called
once, in this order, for `scan`, `watch`, `run` and the library alike:

    Evidence (the scan and what the user gave beside it)
      → find      → Found     every finding, one per event, with its phase: the log's rules,
                              the engine's own numbers, the serving series, the GPU snapshot
      → triage    → Triaged   ordered (memory → parallelism → port → …), a hang when nothing
                              failed, the primary finding, the status
      → cross_check → Triaged the primary held against config.json's arithmetic (budget)
      → advise    → Advised   the next concrete changes (the host asked once for a taken port)
      → conclude  → Diagnosis
      → redact    → Diagnosis every string that leaves the process, masked

No stage reaches back into an earlier one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..advice.core import HostPorts
from ..advice.registry import advise, advise_incomplete
from ..findings import engine_numbers as consistency
from ..findings.engine_detect import detect_engine
from ..findings.hang import hang_finding, last_phase
from ..findings.triage import build_findings, order, status_of
from ..knowledge.loaded import Knowledge
from ..match.scanner import ScanResult
from ..model.records import Diagnosis, EngineInfo, Finding

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:  # imported where used: a plain scan needs neither pyparsing's device grammar nor the budget
    from typing import Any

    from ..budget.shape import ModelShape
    from ..host.gpus import DeviceError, DeviceSnapshot
    from ..knowledge.engine_profiles import Profiles
    from ..match.serving_series import Serving


@dataclass(slots=True)
class Evidence:
    """What one diagnosis reads: the scan of the log, and what the user gave beside it."""

    result: ScanResult
    know: Knowledge
    source: str
    engine: str | None = None  # forced with --engine
    snapshot: DeviceSnapshot | None = None  # --gpus
    snapshot_error: DeviceError | None = None  # --gpus said the driver fails
    extra: list[Finding] = field(default_factory=list)  # findings of the caller (a live run's hang)
    shape: ModelShape | None = None  # --config
    # the log was written on this host (scan, watch, run): who holds its port can be asked here;
    # a stream's records come from other machines
    local: bool = True


@dataclass(slots=True)
class Found:
    """Every finding of the log and beside it, unordered."""

    evidence: Evidence
    engine: EngineInfo
    findings: list[Finding]
    serving: Serving | None
    device: dict[str, Any] | None  # the snapshot as the JSON `device` object


@dataclass(slots=True)
class Triaged:
    """The findings in triage order, the primary one and the status."""

    found: Found
    findings: list[Finding]  # in triage order
    primary: Finding | None  # the verdict: the first finding that is not only information
    status: str
    last_phase: str | None


@dataclass(slots=True)
class Advised:
    """The triaged findings and the changes to make."""

    triaged: Triaged
    advice: list[Any]  # model.Change, the first one to make first


def diagnose(
    result: ScanResult,
    know: Knowledge,
    source_name: str,
    engine: str | None = None,
    snapshot: DeviceSnapshot | None = None,
    snapshot_error: DeviceError | None = None,
    extra: list[Finding] | None = None,
    shape: ModelShape | None = None,
    show_secrets: bool = False,
    local: bool = True,
) -> Diagnosis:
    evidence = Evidence(
        result, know, source_name, engine, snapshot, snapshot_error, list(extra or []), shape, local
    )
    d = conclude(advise_changes(cross_check(triage(find(evidence)))))
    return d if show_secrets else redact(d)


# --- find ------------------------------------------------------------------------------------


def find(ev: Evidence) -> Found:
    result, profiles = ev.result, ev.know.profiles
    info = detect_engine(result, ev.engine)
    findings = build_findings(result, profiles, info.name) + ev.extra
    findings += consistency.check(result, profiles, info.name, findings, ev.source)
    for more in (
        consistency.others_hold_the_gpu(findings),
        consistency.planned_on_gpu_ran_on_cpu(result, ev.source),
    ):
        if more is not None:
            findings.append(more)
    serving = serving_of(result, profiles, info.name)
    if serving is not None and serving.degraded and not any(f.cls == "preemption" for f in findings):
        findings.append(serving_finding(serving))
    device = None
    if ev.snapshot is not None:
        from ..findings.gpu_crosscheck import cross_check as against_snapshot
        from ..host.gpus import apply_visible_devices

        cvd = result.observed.get("cuda_visible_devices")
        snap = apply_visible_devices(ev.snapshot, str(cvd)) if cvd is not None else ev.snapshot
        failed = any(f.severity == "fatal" for f in findings)
        more, device = against_snapshot(findings, snap, result.launch, result.observed, failed)
        findings += more
    if ev.snapshot_error is not None and ev.snapshot_error.driver:
        findings.append(
            Finding(
                rule="device.no-gpu",
                cls="driver",
                severity="fatal",
                source="--gpus",
                line=0,
                title="The GPU snapshot shows no usable GPU",
                evidence=str(ev.snapshot_error),
            )
        )
    return Found(ev, info, findings, serving, device)


def serving_of(result: ScanResult, profiles: Profiles, engine: str) -> Serving | None:
    """The serving phase of the last run, read with the engine's stats-line markers first."""
    from ..match.serving_series import judge_replicas, read_points

    if not result.series:
        return None
    markers = sorted(profiles.series, key=lambda m: m.engine != engine)
    points = read_points(
        result.series, markers, profiles.layout, since_line=result.run_start_line, cache=result.series_read
    )
    cap = result.launch.get("max_num_seqs") or result.observed.get("max_num_seqs")
    try:
        max_num_seqs = int(cap) if cap is not None else None
    except (TypeError, ValueError):
        max_num_seqs = None
    s = judge_replicas(points, result.series_seen, max_num_seqs)
    if s is None:  # stats-line words, but no line the markers could read as a point
        return None
    for p in s.points:  # only the evidence is quoted: the other lines' text stays here
        if p is not s.evidence:
            p.text = ""
    return s


SERVING_TITLES = {
    "kv_bound": "The KV cache is full while requests queue",
    "preemption_storm": "Requests are preempted again and again for lack of KV cache",
    "throughput_collapse": "Generation slows to a crawl under a full KV cache",
}


def serving_finding(s: Serving) -> Finding:
    """A serving verdict that is a real problem, as a finding (class `preemption`)."""
    p = s.evidence
    facts = {
        k: v
        for k, v in (p.values.items() if p else ())
        if k in ("kv_usage", "running", "waiting", "preemptions")
    }
    return Finding(
        rule="serving." + s.verdict.replace("_", "-"),
        cls="preemption",
        severity="warning",
        title=SERVING_TITLES[s.verdict],
        line=p.line if p else 0,
        source=p.source if p else "-",
        evidence=p.text if p else "",
        facts={k: int(v) if v == int(v) else round(v, 4) for k, v in facts.items()},
        time=p.time if p else None,
        note=s.why,
    )


# --- triage ------------------------------------------------------------------------------------


def triage(found: Found) -> Triaged:
    timeline = found.evidence.result.timeline
    findings = order(found.findings)
    if not any(f.severity == "fatal" for f in findings):
        hang = hang_finding(found.evidence.result, timeline)
        if hang is not None:
            findings = order([*findings, hang])
    # info findings (a stop) are told, never the verdict
    primary = next((f for f in findings if f.severity != "info"), None)
    return Triaged(found, findings, primary, status_of(findings, timeline), last_phase(timeline))


# --- cross-check ---------------------------------------------------------------------------------


def cross_check(t: Triaged) -> Triaged:
    """The primary finding against what config.json's arithmetic says (scan --config)."""
    shape = t.found.evidence.shape
    if shape is not None and t.primary is not None:
        join_budget(t.primary, shape, t.found.evidence.result.launch, t.found.device)
    return t


def join_budget(primary: Finding, shape: ModelShape, launch: dict, device: dict | None) -> None:  # type: ignore[type-arg]
    from ..budget.kv import kv_bytes_per_token
    from ..budget.units import GIB
    from ..budget.weights import weight_bytes

    tp = int(launch.get("tensor_parallel_size") or 1) * int(launch.get("pipeline_parallel_size") or 1)
    weights = weight_bytes(shape) / tp / GIB
    primary.facts["plan_weights_gib_per_gpu"] = round(weights, 2)
    primary.facts["plan_kv_bytes_per_token"] = int(kv_bytes_per_token(shape, "auto", 1))
    total = primary.facts.get("total_gib") or primary.facts.get("gpu_total_gib")
    if total is None and device and device.get("gpus"):
        total = min(g["memory_total_mib"] for g in device["gpus"] if g.get("memory_total_mib")) / 1024
    if isinstance(total, (int, float)) and weights > 0.9 * total:
        note = (
            f"the plan says the weights need {weights:.1f} GiB per GPU at tensor_parallel_size {tp}, "
            f"on a {total:.1f} GiB card"
        )
        primary.note = f"{primary.note}; {note}" if primary.note else note


# --- advise --------------------------------------------------------------------------------------


def advise_changes(t: Triaged) -> Advised:
    ev, primary = t.found.evidence, t.primary
    result, know, engine = ev.result, ev.know, t.found.engine.name
    if primary is not None and primary.survived:
        return Advised(t, [])  # the server got past it before it became ready: nothing to change
    if primary is None:
        if t.status != "incomplete":
            return Advised(t, [])
        # stopped by hand during a startup phase: someone waited there; say what it waits on
        stopped = any(f.cls == "stop" for f in t.findings)
        changes = advise_incomplete(
            t.last_phase, engine, result.launch, know.profiles, result.observed, stopped
        )
        return Advised(t, changes)
    rule = know.rules.by_id(primary.rule)
    if rule is None and primary.confidence in ("medium", "low"):
        # a mined template's (or the class table's) finding: its class's vocabulary carries the changes
        rule = next(
            (r for r in know.rules.rules if r.layer == "vocabulary" and r.cls == primary.cls and r.advice),
            None,
        )
    changes = advise(
        primary,
        engine,
        result.launch,
        know.profiles,
        rule=rule,
        frames=set(primary.frames),
        observed=observed_at(result, primary),
        device=t.found.device,
        shape=ev.shape,
        ports=host_ports(primary, result, know.profiles, engine)
        if primary.cls == "port_in_use" and ev.local
        else None,
    )
    return Advised(t, changes)


def observed_at(result: ScanResult, f: Finding) -> dict[str, Any]:
    """What the engine had reported in the run the finding belongs to: a failure from before a
    restart is advised on that run's context (its num_ctx, its KV tokens), not the last run's."""
    for started, seen in result.observed_before:
        if f.line < started:
            return seen
    return result.observed


def host_ports(f: Finding, result: ScanResult, profiles: Profiles, engine: str) -> HostPorts:
    """What this host says about the taken port: who listens on it, which ports are free. Asked
    here, once, so advice computes from facts (when the check runs where the server ran)."""
    from ..host.ports import free_port, port_holder
    from ..knowledge.settings_in_force import value_in_force

    said = f.facts.get("port") or value_in_force(
        "port", result.launch, profiles, engine, f.facts, result.observed
    )
    try:
        port = int(said or 0)
    except (TypeError, ValueError):
        port = 0
    if not 0 < port < 65535:
        return HostPorts(free_rendezvous=free_port(29600))
    return HostPorts(
        holder=port_holder(port), free_after=free_port(port + 1), free_rendezvous=free_port(29600)
    )


# --- conclude, redact -----------------------------------------------------------------------------


def conclude(a: Advised) -> Diagnosis:
    from .durations import durations

    t = a.triaged
    found, ev = t.found, t.found.evidence
    return Diagnosis(
        source=ev.source,
        engine=found.engine,
        status=t.status,
        last_phase=t.last_phase,
        primary=t.primary,
        findings=t.findings,
        timeline=ev.result.timeline,
        launch=ev.result.launch,
        advice=a.advice,
        device=found.device,
        lines_read=ev.result.lines,
        unmatched_errors=ev.result.unmatched_errors,
        serving=found.serving,
        durations=durations(ev.result.timeline),
        two_servers=list(ev.result.own_engines) if len(ev.result.own_engines) > 1 else [],
    )


def redact(d: Diagnosis) -> Diagnosis:
    from ..base.redact import redact_diagnosis

    return redact_diagnosis(d)  # type: ignore[no-any-return]
