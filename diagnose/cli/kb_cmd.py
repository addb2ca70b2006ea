"""`diagnose kb add|list|show|search|export|import`: the incident store's commands."""

import os
from typing import Annotated

from rich.table import Table
from rich.text import Text

from ..base.errors import (
    EXIT_FOUND,
    EXIT_OK,
    InputError,
    yaml_problem,
)
from .app import KbOpt, kb_app, make_console
from .fast_scan import load_kb, load_knowledge
from .lean_typer import typer


@kb_app.command("add")
def kb_add(
    from_scan: Annotated[str | None, typer.Option("--from-scan", help="A report from scan --json.")] = None,
    from_log: Annotated[str | None, typer.Option("--from-log", help="A log to scan first.")] = None,
    root_cause: Annotated[str | None, typer.Option("--root-cause", help="What really caused it.")] = None,
    fix: Annotated[
        list[str] | None, typer.Option("--fix", help="The change that fixed it (repeatable).")
    ] = None,
    path: Annotated[
        list[str] | None, typer.Option("--path", help="A troubleshooting step (repeatable).")
    ] = None,
    title: Annotated[str | None, typer.Option("--title", help="A title (default: the finding's).")] = None,
    tag: Annotated[list[str] | None, typer.Option("--tag", help="A tag (repeatable).")] = None,
    editor: Annotated[
        bool, typer.Option("--editor", help="Edit the incident in $EDITOR before saving.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Record it even though the scan found no failure.")
    ] = False,
    kb: KbOpt = None,
) -> None:
    """Record an incident: symptom (from a diagnosis), path, root cause, fix. Secrets are redacted."""
    import json

    from ..pipeline.scan import scan_paths
    from ..store.incidents import add_incident, diagnosis_from_json, incident_from, store_dirs

    if bool(from_scan) == bool(from_log):
        raise typer.BadParameter("give exactly one of --from-scan REPORT.json or --from-log LOG")
    if from_scan:
        try:
            with open(from_scan, encoding="utf-8") as f:
                d = diagnosis_from_json(json.load(f))
        except OSError as e:
            raise InputError(f"{from_scan}: cannot read: {e.strerror or e}") from None
        except ValueError as e:
            raise InputError(f"{from_scan}: not JSON: {e}") from None
    else:
        d = scan_paths([str(from_log)], load_knowledge(None))
    if d.primary is None and not force:
        # an incident with no symptom would match nothing, or everything healthy
        raise InputError(
            f"{from_scan or from_log}: the scan found no failure ({d.status}); nothing to record "
            "(--force records it anyway)"
        )
    data = incident_from(d, root_cause or "", fix, path, title, tag)
    if editor:
        data = _edit_in_editor(data)
    if not data.get("root_cause"):
        raise typer.BadParameter("an incident needs its root cause: --root-cause TEXT (or --editor)")
    store = store_dirs(kb)[0]
    iid, redacted = add_incident(store, data)
    print(f"added {iid} to {store}")
    if redacted:
        print("redacted: " + ", ".join(f"{n} × {k}" for k, n in sorted(redacted.items())))


def _edit_in_editor(data: dict) -> dict:  # type: ignore[type-arg]
    import subprocess
    import tempfile

    import yaml

    editor_cmd = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.NamedTemporaryFile("w+", suffix=".yaml", delete=False, encoding="utf-8") as tf:
        tf.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        name = tf.name
    try:
        rc = subprocess.call([*editor_cmd.split(), name])
        if rc != 0:
            raise InputError(f"the editor exited with code {rc}; nothing saved")
        with open(name, encoding="utf-8") as f:
            edited = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise InputError(f"the edited incident is not valid YAML: {yaml_problem(e)}") from None
    finally:
        os.unlink(name)
    if not isinstance(edited, dict):
        raise InputError("the edited incident must stay a YAML mapping")
    return edited


@kb_app.command("list")
def kb_list(
    kb: KbOpt = None, json_out: Annotated[bool, typer.Option("--json", help="JSON for machines.")] = False
) -> None:
    """Every incident: id, date, classes, title."""
    import json

    base = load_kb(kb)
    rows = [
        {
            "id": i.id,
            "title": i.title,
            "date": str(i.data.get("date")),
            "classes": i.fingerprint["classes"],
            "starter": i.starter,
        }
        for i in base.incidents
    ]
    if json_out:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    table = Table(box=None, show_edge=False)
    for col in ("id", "date", "classes", "title"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["id"] + (" *" if r["starter"] else ""), r["date"], ",".join(r["classes"]), r["title"])
    c = make_console()
    c.print(table)
    c.print(Text("* shipped starter incident", style="dim"))


@kb_app.command("show")
def kb_show(incident_id: Annotated[str, typer.Argument(help="KB-0001")], kb: KbOpt = None) -> None:
    """One incident, whole."""
    import yaml

    base = load_kb(kb)
    inc = base.get(incident_id)
    if inc is None:
        broken = [p for p in base.problems if f"{incident_id}.yaml" in p]
        if broken:
            raise InputError(f"{incident_id} is corrupt: {broken[0]}")
        raise InputError(f"no incident {incident_id!r} (see `diagnose kb list`)")
    print(yaml.safe_dump(inc.data, sort_keys=False, allow_unicode=True, width=100), end="")
    print(f"# {inc.path}")


@kb_app.command("search")
def kb_search(
    text: Annotated[str, typer.Argument(help="Words that must all appear.")], kb: KbOpt = None
) -> None:
    """Incidents whose text holds every word."""
    hits = load_kb(kb).search(text)
    for inc in hits:
        print(f"{inc.id}  {inc.data.get('date')}  {inc.title}")
    raise typer.Exit(EXIT_OK if hits else EXIT_FOUND)


@kb_app.command("export")
def kb_export(
    out: Annotated[
        str | None, typer.Option("--out", "-o", help="Write the bundle here (default stdout).")
    ] = None,
    kb: KbOpt = None,
) -> None:
    """Your incidents (not the starter set) as one YAML bundle, for sharing."""
    from pathlib import Path

    import yaml

    from ..base.atomic import atomic_write

    base = load_kb(kb)
    bundle = yaml.safe_dump_all(
        [i.data for i in base.incidents if not i.starter], sort_keys=False, allow_unicode=True
    )
    if out:
        atomic_write(Path(out), bundle)
    else:
        print(bundle, end="")


@kb_app.command("import")
def kb_import(
    bundle: Annotated[str, typer.Argument(help="A bundle from kb export.")], kb: KbOpt = None
) -> None:
    """Add every incident of a bundle under fresh ids (redacted, validated)."""
    import yaml

    from ..store.incidents import add_incident, store_dirs

    try:
        with open(bundle, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
    except OSError as e:
        raise InputError(f"{bundle}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InputError(f"{bundle}: not a text bundle (from `diagnose kb export`)") from None
    except yaml.YAMLError as e:
        raise InputError(f"{bundle}: not valid YAML: {yaml_problem(e)}") from None
    store = store_dirs(kb)[0]
    for n, doc in enumerate(docs, 1):
        if not isinstance(doc, dict):
            raise InputError(f"{bundle}: document {n} is not an incident mapping")
        before = set(os.listdir(store)) if os.path.isdir(store) else set()
        iid, _red = add_incident(store, doc, skip_copies=True)
        added = f"{iid}.yaml" not in before
        print(f"{doc.get('id', '?')} → {iid}" + ("" if added else " (already there)"))
