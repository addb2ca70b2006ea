"""`diagnose rules list|show|test`: the rules, profiles and mined templates, explained and tried."""

import os
from typing import Annotated

from rich.table import Table
from rich.text import Text

from ..base.errors import (
    EXIT_FOUND,
    InputError,
)
from .app import RulesOpt, make_console, print_columns, rules_app
from .fast_scan import load_knowledge
from .lean_typer import typer


@rules_app.command("list")
def rules_list(rules: RulesOpt = None) -> None:
    """Every engine profile, then every rule with its class, severity and engines."""
    know = load_knowledge(rules)
    rows = []
    for name in know.engines:
        prof = know.profiles.get(name)
        phases = sorted({m.phase for m in prof.markers if m.what == "phases" and m.phase})
        rows.append((name, prof.title, str(len(phases)), os.path.basename(prof.path) or "(built in)"))
    print_columns(("engine", "title", "phases", "profile"), rows)
    print()
    rows = [
        (r.id, r.cls or "—", r.severity, ",".join(r.engines), r.title)
        for r in sorted(know.rules.rules, key=lambda r: (r.cls or "~", r.id))
    ]
    print_columns(("id", "class", "severity", "engines", "title"), rows)
    print()
    make_console().print(Text(_mined_summary()))


def _mined_summary() -> str:
    """One line on the knowledge mined from the engines' sources (read from the indexes)."""
    from ..knowledge.mined import knowledge

    k = knowledge()
    parts = []
    for name in k.files:
        b = k.bundle(name)
        versions = f"{b.versions[0]}–{b.versions[-1]}" if len(b.versions) > 1 else "".join(b.versions)
        parts.append(f"{name} {versions} ({b.count})")
    return (
        "mined from the engines' own sources (rules/mined; `diagnose rules show <id>` explains one): "
        + ", ".join(parts)
    )


def _show_template(template_id: str) -> None:
    """A mined template (an id such as vllm.m.8204ab7563 in a finding): the engine's own
    message, where its source prints it, the versions, and the class the table gives it."""
    from ..knowledge.mined import knowledge

    k = knowledge()
    engine = template_id.split(".m.", 1)[0]
    t = next((t for b in k.bundles_for(engine) if (t := b.by_id(template_id)) is not None), None)
    if t is None:
        raise InputError(f"no mined template {template_id!r} (ids look like vllm.m.8204ab7563)")
    k.classified(t)
    c = make_console()
    c.print(Text(f"{t.id}  ({t.cls}, mined from {t.source}'s source)", style="bold"))
    c.print(Text(f"  message:  {t.text}"))
    c.print(
        Text(f"  printed:  {t.level}{' ' + t.exc if t.exc else ''} in {t.module} {t.function or ''}".rstrip())
    )
    c.print(Text(f"  versions: {t.versions}"))
    if t.phase:
        c.print(Text(f"  phase:    {t.phase} (the call tree its function belongs to)"))
    c.print(
        Text(
            f"  class:    {t.cls} (rules/mined/classes.yaml row {t.row or '-'}); setting named: {t.param or '-'}"
        )
    )
    c.print(Text(f"  pattern:  {t.pattern}"))


@rules_app.command("show")
def rules_show(
    rule_id: Annotated[str, typer.Argument(help="Rule id (e.g. torch.oom) or engine (e.g. ollama)")],
    rules: RulesOpt = None,
) -> None:
    """What a rule catches, why it happens, a real example and the change it leads to; or an
    engine's profile: detection, phases, flag spellings and defaults."""
    from ..knowledge.engine_profiles import flag_for

    know = load_knowledge(rules)
    r = know.rules.by_id(rule_id)
    if r is None and rule_id in know.profiles.by_engine:
        _show_profile(know, rule_id)
        return
    if r is None and ".m." in rule_id:
        _show_template(rule_id)
        return
    if r is None:
        raise InputError(f"no rule or engine {rule_id!r} (see `diagnose rules list`)")
    c = make_console()
    c.print(Text(f"{r.id}  ({r.cls or 'benign'}, {r.severity}; {', '.join(r.engines)})", style="bold"))
    c.print(Text(r.title))
    c.print()
    c.print(Text("What it catches", style="bold"))
    c.print(Text(f"  needles: {', '.join(repr(n) for n in r.needles)}"))
    c.print(Text(f"  pattern: {r.pattern}"))
    if r.why:
        c.print()
        c.print(Text("Why it happens", style="bold"))
        c.print(Text("  " + r.why))
    c.print()
    c.print(Text("Example", style="bold"))
    for e in r.examples_match:
        c.print(Text("  " + e, style="green"))
    c.print(Text("Not matched", style="bold"))
    for e in r.examples_no_match:
        c.print(Text("  " + e, style="dim"))
    if r.advice:
        c.print()
        c.print(Text("The change (first applicable, one at a time)", style="bold"))
        for a in r.advice:
            spell = ", ".join(
                f"{e}: {flag_for(know.profiles, e, a['param'])}"
                for e in (r.engines if "any" not in r.engines else know.engines)
                if e != "generic" and (a["param"] in know.profiles.get(e).flags or ":" in a["param"])
            )
            c.print(Text(f"  {a['param']}" + (f" → {a['to']}" if a.get("to") else "") + f"   ({spell})"))
    c.print(Text(f"\n  defined in {r.path}", style="dim"))


def _show_profile(know, name: str) -> None:  # type: ignore[no-untyped-def]
    prof = know.profiles.get(name)
    c = make_console()
    c.print(Text(f"{name}  ({prof.title})", style="bold"))
    c.print(Text(f"  defined in {prof.path or '(built in)'}", style="dim"))
    for what, label in (("detect", "Detection"), ("version", "Version"), ("phases", "Phases")):
        ms = [m for m in prof.markers if m.what == what]
        if not ms:
            continue
        c.print()
        c.print(Text(label, style="bold"))
        for m in ms:
            head = (
                f"  {m.phase:<16} "
                if what == "phases"
                else (f"  weight {m.weight:<3} " if what == "detect" else "  ")
            )
            c.print(Text(head + m.pattern))
    if prof.flags:
        c.print()
        c.print(Text("Parameters (canonical → this engine's spelling, default)", style="bold"))
        for param, flag in sorted(prof.flags.items()):
            default = prof.defaults.get(param)
            c.print(
                Text(f"  {param:<26} {flag}" + (f"   (default {default})" if default is not None else ""))
            )
    rules = [r for r in know.rules.rules if name in r.engines]
    if rules:
        c.print()
        c.print(Text(f"Its own rules ({len(rules)}; the `any` rules apply too)", style="bold"))
        for r in rules:
            c.print(Text(f"  {r.id}  {r.title}"))


@rules_app.command("test")
def rules_test(
    log: Annotated[
        str | None, typer.Argument(help="A log to run the rules over (like fail2ban-regex).")
    ] = None,
    rules: RulesOpt = None,
) -> None:
    """Run every rule's examples; with a log, show which rules hit which lines."""
    from ..base.redact import redact  # the log's own lines are shown: secrets stay masked
    from ..knowledge.rules import check_examples
    from ..pipeline.scan import scan_sources
    from ..read.sources import resolve_sources

    know = load_knowledge(rules)
    c = make_console()
    failed = 0
    for r in know.rules.rules:
        problem = check_examples(r, know.profiles.layout)
        if problem:
            failed += 1
            c.print(Text(f"FAIL {r.id}: {problem[0]}: {problem[1]}", style="red"))
    n = len(know.rules.rules)
    c.print(Text(f"examples: {n - failed} rules pass, {failed} fail, {len(know.problems)} skipped as broken"))
    if log is not None:
        result = scan_sources(resolve_sources([log]), know, keep_rule_lines=True)
        c.print()
        c.print(Text(f"{log}: {result.lines} lines", style="bold"))
        table = Table(box=None, show_edge=False)
        for col in ("rule", "hits", "lines"):
            table.add_column(col)
        for rid, lines in sorted(result.rule_lines.items(), key=lambda kv: -len(kv[1])):
            shown = ", ".join(str(x) for x in lines[:8]) + (" …" if len(lines) > 8 else "")
            table.add_row(rid, str(result.hit_counts.get(rid, len(lines))), shown)
        c.print(table)
        c.print(Text(f"unmatched error-looking lines: {result.unmatched_errors}"))
        for line in result.unmatched_examples[:10]:
            c.print(Text(f"  {line.number}: {redact(line.text[:160])}", style="yellow"))
    if failed or know.problems:
        raise typer.Exit(EXIT_FOUND)
