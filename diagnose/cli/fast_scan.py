"""`diagnose scan` without a CLI framework: its argv reader and its body.

A plain scan is the command people pipe into and health checks call, so it must start fast:
importing typer (and the pydantic it brings) costs ~100 ms, several times a scan of a
megabyte. `read_scan_argv` accepts the scan options exactly as the typer command declares
them (a test keeps the two in step) and hands anything else — help, an unknown or repeated
oddity, a bad value — to the full CLI, so usage errors always read the same.
"""

from __future__ import annotations

import sys

from ..base.errors import EXIT_FOUND, EXIT_OK, say_warning
from ..outputs.registry import OUTPUTS

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

FORMATS = tuple(OUTPUTS)

# option -> (keyword of run_scan, kind): "flag", "value" (the last one given wins) or "multi"
SCAN_OPTIONS: dict[str, tuple[str, str]] = {
    "--json": ("json_out", "flag"),
    "--all": ("show_all", "flag"),
    "--format": ("fmt", "value"),
    "--engine": ("engine", "value"),
    "--rules": ("rules", "multi"),
    "--gpus": ("gpus", "value"),
    "--kb": ("kb", "multi"),
    "--config": ("config", "value"),
    "--merge": ("merge", "flag"),
    "--show-secrets": ("show_secrets", "flag"),
    "--chart": ("chart", "flag"),
}


def read_scan_argv(args: list[str]) -> dict[str, Any] | None:
    """Keyword arguments of `run_scan` for `scan ARGS`, or None to let the full CLI decide."""
    kw: dict[str, Any] = {"files": [], "fmt": "text", "json_out": False, "show_all": False}
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if a == "-" or not a.startswith("-"):
            kw["files"].append(a)
            continue
        name, eq, value = a.partition("=")
        spec = SCAN_OPTIONS.get(name)
        if spec is None:
            return None  # help, `--`, short options, typos: the full CLI says what they mean
        key, kind = spec
        if kind == "flag":
            if eq:
                return None
            kw[key] = True
            continue
        if not eq:
            if i >= len(args) or (args[i].startswith("-") and args[i] != "-"):
                return None
            value = args[i]
            i += 1
        if kind == "multi":
            kw.setdefault(key, []).append(value)
        else:
            kw[key] = value
    if kw["fmt"] not in FORMATS:
        return None
    if not kw["files"] and (sys.stdin is None or sys.stdin.isatty()):
        return None  # nothing to read: the full CLI explains
    return kw


def load_knowledge(rules: list[str] | None):  # type: ignore[no-untyped-def]
    from ..knowledge.loaded import Knowledge

    know = Knowledge.load(rules)
    for p in know.problems:
        say_warning(f"{p} (skipped)")
    return know


def warn_timed_out(know) -> None:  # type: ignore[no-untyped-def]
    """A user pattern that timed out matched nothing there: say which rule, never silently."""
    from ..search.patterns import GIVE_UP_AFTER, TIMED_OUT

    for r in know.rules.rules:
        n = TIMED_OUT.get(r.pattern)
        if n:
            stopped = f"; not tried again after {GIVE_UP_AFTER}" if n >= GIVE_UP_AFTER else ""
            say_warning(
                f"{r.path}: rule {r.id}: field 'pattern': timed out on {n} line(s){stopped}, so it "
                "matched nothing there; it backtracks: bound its repeats"
            )


def load_kb(dirs: list[str] | None):  # type: ignore[no-untyped-def]
    from ..store.incidents import KnowledgeBase, store_dirs

    base = KnowledgeBase.load(store_dirs(dirs))
    for p in base.problems:
        say_warning(f"{p} (skipped)")
    return base


def kb_matches(d, dirs: list[str] | None, read: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """Past incidents like this diagnosis (a broken store never stops a scan); `read` keeps the
    stores once read for the other logs of the same call."""
    if d.status not in ("failed", "degraded"):
        return []
    base = (read or {}).get("kb")
    if base is None:
        base = load_kb(dirs)
        if read is not None:
            read["kb"] = base
    return base.match(d)  # type: ignore[no-any-return]


def run_scan(
    files: list[str] | None = None,
    fmt: str = "text",
    json_out: bool = False,
    show_all: bool = False,
    engine: str | None = None,
    rules: list[str] | None = None,
    gpus: str | None = None,
    kb: list[str] | None = None,
    config: str | None = None,
    merge: bool = False,
    show_secrets: bool = False,
    chart: bool = False,
) -> int:
    """Scan, print the diagnosis, return the exit code (options already checked).

    Several files are several logs: one diagnosis each, in argument order (a JSON array); one
    that cannot be read is an error line for that file, not the end of the others. `merge`
    reads them as the logs of one run (nodes or ranks), interleaved by their timestamps."""
    from ..base.errors import InputError, say_error
    from ..outputs.registry import emit
    from ..outputs.styled import wants_rich
    from ..pipeline.scan import scan_paths

    chart = chart or wants_rich()  # the serving chart is for a terminal, or when asked
    if show_secrets:  # the gate at the process's output lets them through too
        from ..base.redact import show_secrets as let_secrets_out

        let_secrets_out()

    know = load_knowledge(rules)
    know.check_engine(engine)  # the engines are the profiles, user ones included
    paths = list(files or ["-"])
    if merge or len(paths) == 1:
        d = scan_paths(paths, know, engine, gpus=gpus, config=config, show_secrets=show_secrets)
        d.kb = kb_matches(d, kb)
        emit("json" if json_out else fmt, [d], show_all=show_all, chart=chart)
        warn_timed_out(know)
        return EXIT_FOUND if d.status in ("failed", "degraded") else EXIT_OK
    done = []
    unreadable: list[tuple[int, str, str]] = []  # (position, file, why)
    read: dict[str, Any] = {}  # the incident stores, read once for all the logs
    for i, path in enumerate(paths):
        try:
            d = scan_paths([path], know, engine, gpus=gpus, config=config, show_secrets=show_secrets)
        except InputError as e:
            say_error(str(e))
            why = str(e)
            unreadable.append((i, path, why[len(path) + 2 :] if why.startswith(path + ": ") else why))
            continue
        d.kb = kb_matches(d, kb, read)
        done.append(d)
    fmt_name = "json" if json_out else fmt
    emit(fmt_name, done, several=True, show_all=show_all, chart=chart, unreadable=unreadable)
    warn_timed_out(know)
    if any(d.status in ("failed", "degraded") for d in done):
        return EXIT_FOUND
    from ..base.errors import EXIT_USAGE

    return EXIT_USAGE if unreadable else EXIT_OK
