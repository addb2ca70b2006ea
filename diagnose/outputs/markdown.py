"""A diagnosis as Markdown, to paste into an issue or a chat thread."""

from __future__ import annotations

from ..model.records import Diagnosis
from .text import (
    PHASE_LABEL,
    STATUS_MARK,
    _facts_text,
    change_text,
    describe,
    ranks_text,
    serving_headline,
    verdict,
)


def render(d: Diagnosis, show_all: bool = False, chart: bool = False) -> str:
    """The Markdown output (outputs.OUTPUTS["markdown"]): for an issue or a chat thread."""
    mark = STATUS_MARK.get(d.status, ("?", ""))[0]
    eng = d.engine.label
    out = [
        f"### {mark} {verdict(d)}",
        "",
        f"**Engine:** {eng} · **Status:** `{d.status}` · **Last phase:** `{d.last_phase or '—'}`",
        "",
    ]
    if d.two_servers:
        out += [
            f"> ⚠ Two servers in one log: {' and '.join(d.two_servers)} each printed their own startup "
            "lines; this verdict mixes them. Read each server's log alone.",
            "",
        ]
    p = d.primary
    if p:
        rk = f", ranks {ranks_text(p.ranks)}" if len(p.ranks) > 1 else ""
        out += [
            f"**Evidence** (`{public_path(p.source)}:{p.line}`{rk}, rule `{p.rule}`, class `{p.cls}`"
            + (f", OOM phase `{p.oom_phase}`" if p.oom_phase else "")
            + "):",
            "",
            "```",
            p.evidence[:2000],
            "```",
            "",
        ]
        if p.facts:
            out += ["**Facts:** " + _facts_text(p.facts), ""]
    out += _advice_and_kb(d)
    if d.device:
        out += [f"**GPUs:** {d.device['summary']}", ""]
        out += [f"- ⚠ {w['text']}" for w in d.device["warnings"]]
        out += [""] if d.device["warnings"] else []
    if d.timeline:
        out += ["| phase | line | time |", "|---|---|---|"]
        out += [f"| {PHASE_LABEL.get(m.phase, m.phase)} | {m.line} | {m.time or ''} |" for m in d.timeline]
        out += [""]
        from ..pipeline.durations import said

        took = said(d.durations)
        if took:
            out += [f"**Startup:** {took}", ""]
    if d.serving is not None:
        out += [f"**Serving:** {serving_headline(d.serving)} — {d.serving.why}", ""]
        if d.serving.next_step:
            out += [f"- next: {d.serving.next_step}", ""]
    others = [f for f in d.findings if f is not p]
    if others:
        out += ["**Other findings:**", ""]
        out += [
            f"- {f.severity} `{public_path(f.source)}:{f.line}` {describe(f)}"
            + (" (consequence)" if f.consequence else "")
            for f in others[:10]
        ]
        out += [""]
    out.append(f"<sub>diagnose · {d.lines_read} lines read</sub>")
    return "\n".join(out)


def _advice_and_kb(d: Diagnosis) -> list[str]:
    """The next change, its alternatives, and the past incidents (or known families) it matches."""
    out: list[str] = []
    if d.advice:
        c = d.advice[0]
        out += [
            "**Next change:** `" + change_text(c) + "`",
            "",
            f"- why: {c.why}",
            f"- verify: {c.verify}",
            "",
        ]
        if len(d.advice) > 1:
            out += ["**Alternatives** (one at a time):", ""]
            out += [f"- `{change_text(a)}` — {a.why}" for a in d.advice[1:4]]
            out += [""]
    for m in d.kb:
        out += [
            (
                f"**Known family** (shipped starter incident): {m['id']} {m['title']}"
                if m.get("starter")
                else f"**Seen before:** {m['id']} ({m.get('date', '')}) {m['title']}"
            )
            + (f" — fixed by `{m['fix_text']}`" if m.get("fix_text") else "")
            + f" (match {m['score']:.2f})",
            "",
        ]
    return out


def public_path(source: str) -> str:
    """A log's path as an issue thread should read it: relative to here when under it, else its
    name alone (an absolute path shows a user name and a machine's layout)."""
    import os

    if not os.path.isabs(source):
        return source
    try:
        rel = os.path.relpath(source)
    except ValueError:  # another drive (Windows)
        return os.path.basename(source)
    return rel if not rel.startswith("..") else os.path.basename(source)
