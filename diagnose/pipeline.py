"""The scan pipeline: sources → lines → matcher → triage → advice → Diagnosis."""

from __future__ import annotations

from collections.abc import Iterable

from . import consistency
from .advice import advise, advise_incomplete
from .clock import seconds
from .engines import Profiles, load_profiles
from .errors import InputError
from .lines import Source, interleaved_blocks, read_blocks, resolve_sources
from .matcher import Scanner, ScanResult
from .model import Diagnosis, Finding
from .records import field, record
from .rules import RuleSet, load_rules
from .triage import build_findings, detect_engine, hang_finding, last_phase, order, status_of

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:  # imported where used: a plain scan needs neither pyparsing's device grammar nor the budget
    from typing import Any

    from .budget import ModelShape
    from .device import DeviceError, DeviceSnapshot
    from .serving import Serving


@record
class Knowledge:
    """Rules and engine profiles, loaded once per process."""

    rules: RuleSet
    profiles: Profiles
    problems: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, extra_dirs: list[str] | None = None) -> Knowledge:
        profiles = load_profiles(extra_dirs)
        rules = load_rules(extra_dirs, known_engines=set(profiles.by_engine), layout=profiles.layout)
        if not rules.rules:
            raise InputError(
                "no usable rules: " + ("; ".join(rules.problems) or "the rules directory is empty")
            )
        return cls(rules, profiles, rules.problems + profiles.problems)

    @property
    def engines(self) -> list[str]:
        """The engines this installation knows: one per profile (rules/engines/*.yaml)."""
        return sorted(self.profiles.by_engine)

    def check_engine(self, engine: str | None) -> None:
        if engine is not None and engine not in self.profiles.by_engine:
            raise InputError(f"unknown engine {engine!r} (known: {', '.join(self.engines)})")


def scan_sources(
    sources: Iterable[Source],
    know: Knowledge,
    engine: str | None = None,
    keep_rule_lines: bool = False,
    interleave: bool = False,
) -> ScanResult:
    """One scan over the sources: one after the other, or (`interleave`, the logs of one run)
    line by line in the order of their timestamps."""
    scanner = Scanner(know.rules, know.profiles, engine=engine, keep_rule_lines=keep_rule_lines)
    if interleave:
        layout = know.profiles.layout.fresh()

        def clock(name: str, head: bytes) -> float | None:
            return seconds(layout.line(name, 0, head).timestamp)

        for name, block in interleaved_blocks(list(sources), clock):
            scanner.set_source(name)
            scanner.feed(block)
        return scanner.finish()
    for src in sources:
        scanner.set_source(src.name)
        for block in read_blocks(src):
            scanner.feed(block)
    return scanner.finish()


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
) -> Diagnosis:
    info = detect_engine(result, engine)
    findings = build_findings(result, know.profiles, info.name) + list(extra or [])
    findings += consistency.check(result, know.profiles, info.name, findings, source_name)
    serving = serving_of(result, know.profiles, info.name)
    if serving is not None and serving.degraded and not any(f.cls == "preemption" for f in findings):
        findings.append(serving_finding(serving))
    failed = any(f.severity == "fatal" for f in findings)
    device = None
    if snapshot is not None:
        from .crosscheck import cross_check
        from .device import apply_visible_devices

        cvd = result.observed.get("cuda_visible_devices")
        snap = apply_visible_devices(snapshot, str(cvd)) if cvd is not None else snapshot
        extra, device = cross_check(findings, snap, result.launch, result.observed, failed)
        findings += extra
    if snapshot_error is not None and snapshot_error.driver:
        findings.append(
            Finding(
                rule="device.no-gpu",
                cls="driver",
                severity="fatal",
                source="--gpus",
                line=0,
                title="The GPU snapshot shows no usable GPU",
                evidence=str(snapshot_error),
            )
        )
    findings = order(findings)
    if not any(f.severity == "fatal" for f in findings):
        hang = hang_finding(result, result.timeline)
        if hang is not None:
            findings = order([*findings, hang])
    # info findings (a stop) are told, never the verdict
    primary = next((f for f in findings if f.severity != "info"), None)
    if shape is not None and primary is not None:
        join_budget(primary, shape, result.launch, device)
    rule = know.rules.by_id(primary.rule) if primary else None
    if primary is not None and rule is None and primary.confidence in ("medium", "low"):
        # a mined template's (or the class table's) finding: its class's vocabulary carries the changes
        rule = next(
            (r for r in know.rules.rules if r.layer == "vocabulary" and r.cls == primary.cls and r.advice),
            None,
        )
    advice = advise(
        primary,
        info.name,
        result.launch,
        know.profiles,
        rule=rule,
        frames=set(primary.frames) if primary else None,
        observed=observed_at(result, primary),
        device=device,
        shape=shape,
    )
    status = status_of(findings, result.timeline)
    if primary is None and status == "incomplete":
        # stopped by hand during a startup phase: someone waited there; say what it waits on
        stopped = any(f.cls == "stop" for f in findings)
        advice = advise_incomplete(
            last_phase(result.timeline), info.name, result.launch, know.profiles, result.observed, stopped
        )
    d = Diagnosis(
        source=source_name,
        engine=info,
        status=status,
        last_phase=last_phase(result.timeline),
        primary=primary,
        findings=findings,
        timeline=result.timeline,
        launch=result.launch,
        advice=advice,
        device=device,
        lines_read=result.lines,
        unmatched_errors=result.unmatched_errors,
        serving=serving,
    )
    if not show_secrets:
        from .redact import redact_diagnosis

        redact_diagnosis(d)
    return d


def serving_of(result: ScanResult, profiles: Profiles, engine: str) -> Serving | None:
    """The serving phase of the last run, read with the engine's stats-line markers first."""
    from .serving import judge_replicas, read_points

    if not result.series:
        return None
    markers = sorted(profiles.series, key=lambda m: m.engine != engine)
    points = read_points(result.series, markers, profiles.layout, since_line=result.run_start_line)
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


def observed_at(result: ScanResult, f: Finding | None) -> dict[str, Any]:
    """What the engine had reported in the run the finding belongs to: a failure from before a
    restart is advised on that run's context (its num_ctx, its KV tokens), not the last run's."""
    if f is not None:
        for started, seen in result.observed_before:
            if f.line < started:
                return seen
    return result.observed


def join_budget(primary: Finding, shape: ModelShape, launch: dict, device: dict | None) -> None:  # type: ignore[type-arg]
    """What the arithmetic from config.json says about this failure (scan --config)."""
    from .budget import GIB, kv_bytes_per_token, weight_bytes

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


def load_snapshot(path: str) -> tuple[DeviceSnapshot | None, DeviceError | None]:
    """Read `--gpus FILE` (or `--gpus 2x80`, two GPUs of 80 GiB): a snapshot, or the driver
    error it reports; other problems raise."""
    import os

    from .device import DeviceError, DeviceSnapshot, Gpu, parse_nvidia_smi

    if not os.path.exists(path):
        from .budget import parse_gpus_spec

        given = parse_gpus_spec(path)
        if given is not None:
            n, gib = given
            gpus = [
                Gpu(index=i, name="(given)", memory_total_mib=int(gib * 1024), memory_used_mib=None)
                for i in range(n)
            ]
            return DeviceSnapshot(gpus=gpus, source="given"), None

    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(4 << 20)  # nvidia-smi output is small; a huge file is not one
    except OSError as e:
        raise InputError(f"{path}: cannot read the GPU snapshot: {e.strerror or e}") from None
    try:
        return parse_nvidia_smi(text), None
    except DeviceError as e:
        if e.driver:
            return None, e
        raise DeviceError(f"{path}: {e}") from None


def scan_paths(
    paths: list[str],
    know: Knowledge | None = None,
    engine: str | None = None,
    gpus: str | None = None,
    config: str | None = None,
    show_secrets: bool = False,
) -> Diagnosis:
    """One diagnosis of these paths read as one log (several: the logs of one run, interleaved
    by their timestamps)."""
    know = know or Knowledge.load()
    sources = resolve_sources(paths)
    snapshot, snap_err = load_snapshot(gpus) if gpus else (None, None)
    result = scan_sources(sources, know, engine, interleave=len(sources) > 1)
    name = ", ".join(s.name for s in sources)
    shape = None
    if config:
        from .budget import load_config, shape_from_config

        shape = shape_from_config(load_config(config))
    return diagnose(result, know, name, engine, snapshot, snap_err, shape=shape, show_secrets=show_secrets)
