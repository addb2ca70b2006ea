"""Three renderers of one Diagnosis: calm rich text for people, JSON (schema 1), markdown."""

from __future__ import annotations

from ..model.records import Diagnosis, Finding
from ..model.taxonomy import TAXONOMY
from .styled import StyledLines

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

PHASE_LABEL = TAXONOMY.phase_label  # phases as people read them (rules/taxonomy/taxonomy.yaml)
STATUS_MARK = {
    "failed": ("✗", "bold red"),
    "degraded": ("!", "bold yellow"),
    "ready": ("✓", "bold green"),
    "incomplete": ("…", "bold cyan"),
}


def ranks_text(ranks: list[int]) -> str:
    """[0, 1, 2, 3, 5] -> '0–3, 5'."""
    if not ranks:
        return ""
    parts: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}–{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(parts)


def describe(f: Finding) -> str:
    s = f.title
    if f.cls in ("oom", "kv_cache_too_small") and f.oom_phase:
        when = {
            "load": "while loading weights",
            "startup": "during startup (after the weights loaded)",
            "runtime": "while serving",
        }[f.oom_phase]
        if f.phase_inferred == "default":  # read from nothing: say it is a guess, up front
            short = {"load": "loading weights", "startup": "startup", "runtime": "serving"}[f.oom_phase]
            when = f"phase not in the log (assumed {short})"
        s += f" — {when}"
    return s


def verdict(d: Diagnosis) -> str:
    p = d.primary
    if d.status == "failed" and p:
        return f"failed: {describe(p)}"
    if d.status == "degraded" and p:
        return f"degraded: {describe(p)}"
    stop = next((f for f in d.findings if f.cls == "stop"), None)
    if d.status == "ready":
        if stop is not None:
            return f"ready, then stopped at line {stop.line}: no failure found"
        if p is not None and p.cls == "request":
            said = describe(p)
            return f"ready, but {said[:1].lower()}{said[1:]}"
        return "ready: startup completed, no failure found"
    where = (
        f"during {PHASE_LABEL.get(d.last_phase, d.last_phase)}"
        if d.last_phase
        else "before any startup phase"
    )
    if stop is not None:
        return f"incomplete: stopped at line {stop.line} {where}, with no error before it"
    return f"incomplete: the log ends {where}, with no error"


def _facts_text(facts: dict[str, Any]) -> str:
    from ..model.typed_facts import impossible_facts

    items = []
    bad = impossible_facts(facts)
    for k, v in facts.items():
        if k == "self_listed":
            continue
        if k in bad:  # said as what the log claims, not as a fact
            items.append(f"{k[:-4]} {v} GiB (impossible: the driver misreports it)")
        elif k.endswith("_gib"):
            items.append(f"{k[:-4]} {v} GiB")
        else:
            items.append(f"{k} {v}")
    return " · ".join(items)


def render_text(d: Diagnosis, show_all: bool = False, chart: bool = False) -> StyledLines:
    """The diagnosis for people: verdict, evidence, timeline, next change, past incidents."""
    out = StyledLines()
    mark, style = STATUS_MARK.get(d.status, ("?", "bold"))
    out.add((f"{mark} {verdict(d)}", style), (f"   [{d.engine.label}]", "dim"))
    if d.two_servers:
        out.add(
            f"  ! two servers in one log: {' and '.join(d.two_servers)} each printed their own startup "
            "lines; this verdict mixes them — read each server's log alone",
            style="bold yellow",
        )
    _evidence_text(out, d)
    _gpus_text(out, d)
    _timeline_text(out, d)
    if d.serving is not None:
        _serving_text(out, d, chart)
    _advice_text(out, d)
    _kb_text(out, d)
    _others_text(out, d, show_all)
    if d.status == "incomplete" and d.last_phase and TAXONOMY.waits_on.get(d.last_phase):
        out.blank()
        out.add(
            f"  if it stays in this phase, it usually waits on {TAXONOMY.waits_on[d.last_phase]};"
            " follow it live with `diagnose watch`",
            style="dim",
        )
    out.blank()
    out.add(f"  engine {d.engine.name}: {d.engine.reason or ''}", style="dim")
    return out


def _evidence_text(out: StyledLines, d: Diagnosis) -> None:
    p = d.primary
    if not p:
        return
    out.blank()
    where = f"{p.source}:{p.line}" if p.line else p.source
    extra = []
    if p.ranks:
        extra.append(f"rank{'s' if len(p.ranks) > 1 else ''} {ranks_text(p.ranks)}")
    if p.time:
        extra.append(p.time)
    if p.phase_at:
        extra.append(f"during {PHASE_LABEL.get(p.phase_at, p.phase_at)}")
    out.add(("  evidence  ", "bold"), (where, "cyan"), ("  " + " · ".join(extra) if extra else "", "dim"))
    out.add("    " + p.evidence[:400], style="bold")
    info = [f"rule {p.rule} · class {p.cls}" + (f" · OOM phase {p.oom_phase}" if p.oom_phase else "")]
    if p.phase_evidence:
        info.append(f"OOM phase {p.oom_phase} from {p.phase_evidence}")
    if p.facts:
        info.append(_facts_text(p.facts))
    if p.note:
        info.append(p.note)
    if p.count > 1:
        info.append(f"seen {p.count} times")
    for line in info:
        out.add("    " + line, style="dim")


def _gpus_text(out: StyledLines, d: Diagnosis) -> None:
    if d.device:
        out.blank()
        out.add(("  gpus      ", "bold"), d.device["summary"])
        for w in d.device["warnings"]:
            out.add(f"    ! {w['text']}", style="yellow")


def _timeline_text(out: StyledLines, d: Diagnosis) -> None:
    if not d.timeline:
        return
    out.blank()
    segs: list[str | tuple[str, str]] = [("  timeline  ", "bold")]
    marks: list[tuple[int, str, str]] = [(m.line, PHASE_LABEL.get(m.phase, m.phase), "") for m in d.timeline]
    p = d.primary
    if p and p.severity == "fatal" and p.line:
        marks.append((p.line, "✗", "red"))
    for i, (line, label, style) in enumerate(sorted(marks, key=lambda x: (x[0], x[1] == "✗"))):
        if i:
            segs.append((" → ", "dim"))
        segs.append((label, style))
        segs.append((f" {line}", style or "dim"))
    out.add(*segs)
    from ..pipeline.durations import said

    took = said(d.durations)
    if took:
        out.add(("  took      ", "bold"), (took, "dim"))


def _advice_text(out: StyledLines, d: Diagnosis) -> None:
    if not d.advice:
        return
    out.blank()
    first = d.advice[0]
    out.add("  next change", style="bold")
    out.add("    " + change_text(first), style="bold green")
    out.add(f"    why     {first.why}")
    out.add(f"    verify  {first.verify}", style="dim")
    if len(d.advice) > 1:
        out.add("  if that is not enough (one at a time)", style="bold")
        for c in d.advice[1:4]:
            out.add(("    " + change_text(c), "green"), (f"  {c.why}", "dim"))


def _kb_text(out: StyledLines, d: Diagnosis) -> None:
    for m in d.kb:
        out.blank()
        fixed = f" — fixed by {m['fix_text']}" if m.get("fix_text") else ""
        # a shipped starter incident is a known family, not something this site lived through
        out.add(
            ("  known family " if m.get("starter") else "  seen before  ", "bold"),
            (f"{m['id']}" + ("" if m.get("starter") else f" {m.get('date', '')}"), "cyan"),
            f", {m['title']}{fixed}",
            (f"  (match {m['score']:.2f})", "dim"),
        )
        if m.get("root_cause"):
            out.add(f"    root cause: {m['root_cause']}", style="dim")


def _others_text(out: StyledLines, d: Diagnosis, show_all: bool) -> None:
    others = [f for f in d.findings if f is not d.primary]
    if not others:
        return
    out.blank()
    out.add("  other findings", style="bold")
    for f in others[: None if show_all else 6]:
        r = f" ranks {ranks_text(f.ranks)}" if len(f.ranks) > 1 else ""
        tag = " (consequence)" if f.consequence else ""
        out.add(
            (f"    {f.severity:<7} ", _sev_style(f.severity)),
            (f"{f.source}:{f.line}", "cyan"),
            f"  {describe(f)}{tag}",
            (r, "dim"),
        )
    if not show_all and len(others) > 6:
        out.add(f"    … {len(others) - 6} more (--all)", style="dim")


def serving_headline(s: Any) -> str:
    """One line of what the serving phase looked like: the verdict and its ranges."""
    parts = [s.verdict.replace("_", " "), f"{s.seen} stats line{'s' if s.seen != 1 else ''}"]
    sm = s.summary
    if "running" in sm:
        parts.append(f"running ≤ {sm['running']['max']}")
    if "waiting" in sm:
        parts.append(f"waiting ≤ {sm['waiting']['max']}")
    if "kv_usage" in sm:
        parts.append(f"KV ≤ {sm['kv_usage']['max']:.0%}")
    if "gen_tps" in sm:
        parts.append(f"gen ≤ {sm['gen_tps']['max']:g} tok/s")
    return " · ".join(parts)


def _serving_text(out: StyledLines, d: Diagnosis, chart: bool) -> None:
    from ..match.serving_series import chart as serving_chart

    s = d.serving
    out.blank()
    style = "yellow" if s.degraded else ""
    out.add(("  serving   ", "bold"), (serving_headline(s), style))
    out.add(f"    {s.why}", style="dim")
    if s.next_step:
        out.add(f"    next: {s.next_step}", style="green")
    if chart:
        for row in serving_chart(s):
            out.add("    " + row, style="cyan")


def _sev_style(sev: str) -> str:
    return {"fatal": "red", "error": "red", "warning": "yellow", "info": "dim"}.get(sev, "")


def change_text(c: Any) -> str:
    if c.param.startswith("action:"):
        return c.to
    boolean_flag = c.to in ("true", "True") and c.param in ("enforce_eager", "trust_remote_code")
    if c.param.startswith("env:") or c.param == "shm_size" or "=" in c.flag:
        s = c.flag  # NAME=value or --shm-size 16g: the value is already in it
    elif boolean_flag and c.flag.startswith("--"):
        s = c.flag
    elif not c.flag.startswith("-"):
        s = f"{c.flag} = {c.to}"  # a config-file key (generic servers)
    else:
        s = f"{c.flag} {c.to}"
    if c.frm is not None and c.frm != c.to:
        s += f"   (was {c.frm})"
    return s


def render(d: Diagnosis, show_all: bool = False, chart: bool = False) -> StyledLines:
    """The text output (outputs.OUTPUTS["text"])."""
    return render_text(d, show_all, chart)
