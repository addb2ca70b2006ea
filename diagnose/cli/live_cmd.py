"""`diagnose watch` and `diagnose run`: the live part's sessions behind their options."""

import os
from typing import Annotated

from rich.console import Console
from rich.text import Text

from ..base.errors import (
    EXIT_FOUND,
    EXIT_OK,
    InputError,
    say_error,
)
from .app import BudgetOpt, EngineOpt, RulesOpt, app, at_least, make_console
from .fast_scan import load_knowledge
from .fleet_cmd import (
    AlertmanagerOpt,
    AlertRepostOpt,
    EventsOpt,
    ExcludeOpt,
    Fleet,
    IdleCloseOpt,
    IncludeOpt,
    MaxSessionsOpt,
    MetricsAddrOpt,
    MetricsPortOpt,
)
from .lean_typer import typer


def _follow_until_verdict(follower, session, progress, timeout: float | None, started: float):  # type: ignore[no-untyped-def]
    """`watch` on one file: the follower's lines into the session until a verdict (or Ctrl-C)."""
    import time

    from ..live.session import Verdict

    verdict = None
    try:
        while verdict is None:
            follower.check()
            verdict = session.check()
            progress.update()
            if verdict is None and timeout is not None and time.monotonic() - started > timeout:
                follower.flush_partial()
                verdict = Verdict("timeout", session.diagnosis(final=True))
            if verdict is None:
                follower.wait(0.5)
    except KeyboardInterrupt:
        # Ctrl-C: what the log says so far is still worth printing
        follower.check()
        follower.flush_partial()
        verdict = Verdict("interrupted", session.diagnosis(final=True))
    finally:
        progress.stop()
        follower.stop()
    return verdict


def _check_followable(file: str) -> None:
    """A log to follow: not a directory, not binary (it may not exist yet)."""
    if os.path.isdir(file):
        raise InputError(f"{file}: is a directory, not a log file")
    if os.path.isfile(file):
        try:
            with open(file, "rb") as fh:
                head = fh.read(8192)
        except OSError as e:
            raise InputError(f"{file}: cannot read: {e.strerror or e}") from None
        from ..read.sources import looks_binary

        if looks_binary(head):
            raise InputError(f"{file}: binary data, not a text log")


def _live_setup(engine, rules, gpus, budget, follow):  # type: ignore[no-untyped-def]
    from ..live.session import LiveSession, parse_budgets
    from ..pipeline.scan import load_snapshot

    try:
        budgets = parse_budgets(budget)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--budget") from None
    snapshot, _err = load_snapshot(gpus) if gpus else (None, None)
    return (
        LiveSession,
        dict(engine=engine, budgets=budgets, follow_after_ready=follow, snapshot=snapshot),
        rules,
    )


def _finish_live(verdict, json_out: bool, console: Console, started: float) -> int:  # type: ignore[no-untyped-def]
    import time

    from ..outputs.registry import emit
    from ..outputs.styled import print_styled
    from ..outputs.text import render_text

    d = verdict.diagnosis
    if json_out:
        emit("json", [d])
    else:
        if verdict.kind == "ready":
            from ..pipeline.durations import said, span

            took = said(d.durations) if d.durations and d.durations.get("startup_s") is not None else None
            wall = (
                f"ready in {span(time.monotonic() - started)} by diagnose's clock (the log prints no times)"
            )
            console.print(Text(took or wall, style="bold green"))
        elif verdict.kind == "timeout":
            console.print(
                Text("stopped watching (--timeout): the server is not ready yet", style="bold yellow")
            )
        elif verdict.kind == "interrupted":
            console.print(Text("stopped watching (Ctrl-C): the log so far", style="bold yellow"))
        elif verdict.kind == "stopped":
            console.print(
                Text("stopped watching at --timeout: the server had become ready", style="bold green")
            )
        print_styled(render_text(d), console)
    if verdict.kind in ("ready", "stopped") or (
        verdict.kind == "ended" and d.status in ("ready", "incomplete")
    ):
        return EXIT_OK
    return EXIT_FOUND


@app.command()
def watch(
    file: Annotated[str | None, typer.Argument(help="The log to follow (it may not exist yet).")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="Keep watching after ready, for runtime failures.")
    ] = False,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Give up after S seconds.")] = None,
    from_end: Annotated[bool, typer.Option("--from-end", help="Skip what the file already holds.")] = False,
    poll: Annotated[bool, typer.Option("--poll", help="Poll instead of inotify (NFS, bind mounts).")] = False,
    budget: BudgetOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the final diagnosis as JSON.")] = False,
    engine: EngineOpt = None,
    rules: RulesOpt = None,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="nvidia-smi output to cross-check against.")
    ] = None,
    glob: Annotated[
        str | None,
        typer.Option(
            "--glob",
            help="Node agent: follow every file matching this pattern (e.g. '/var/log/pods/*/*/*.log'), "
            "a session per container, JSON verdict lines as `stream`.",
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", help="With --glob: seconds between looks at the files.")
    ] = 1.0,
    node: Annotated[
        str | None,
        typer.Option("--node", help="With --glob: the node's name in the labels (default: $NODE_NAME)."),
    ] = None,
    max_sessions: MaxSessionsOpt = 10_000,
    idle: IdleCloseOpt = None,
    events: EventsOpt = None,
    metrics_port: MetricsPortOpt = None,
    metrics_addr: MetricsAddrOpt = "127.0.0.1",
    alertmanager: AlertmanagerOpt = None,
    alert_repost: AlertRepostOpt = 60.0,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
) -> None:
    """Follow a startup log live: phases as they pass, a verdict on the first fatal line, ready, or a hang."""
    import time

    if glob is not None:
        if file is not None:
            raise typer.BadParameter("give a FILE or --glob PATTERN, not both", param_hint="--glob")
        from ..fleet.node_agent import NodeAgent
        from ..fleet.stream_command import run_agent

        at_least("--interval", interval, 0.01)
        at_least("--timeout", timeout, 0.001)
        fleet = Fleet(max_sessions, idle, events, False, metrics_port, metrics_addr, alertmanager, budget)
        fleet.scope(include, exclude, alert_repost)
        agent = NodeAgent(glob, from_end=from_end, node=node)
        raise typer.Exit(
            fleet.run(lambda sessions, out: run_agent(agent, sessions, out, interval, timeout), engine, rules)
        )
    if file is None:
        raise typer.BadParameter("give the log to follow (or --glob PATTERN for every log of a node)")
    _check_followable(file)
    from ..live.follow import Follower
    from ..live.session import make_progress

    at_least("--timeout", timeout, 0.001)
    session_cls, kwargs, rules = _live_setup(engine, rules, gpus, budget, follow)
    session = session_cls(load_knowledge(rules), file, **kwargs)
    console = make_console()
    follower = Follower(file, session.feed, from_end=from_end, poll=poll)
    try:
        follower.start()
    except FileNotFoundError as e:
        raise InputError(str(e)) from None
    progress = make_progress(session, console, json_out)
    started = time.monotonic()
    verdict = _follow_until_verdict(follower, session, progress, timeout, started)
    raise typer.Exit(_finish_live(verdict, json_out, console, started))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    log: Annotated[str | None, typer.Option("--log", help="Write the server's output here too.")] = None,
    stop_on_failure: Annotated[
        bool, typer.Option("--stop-on-failure", help="Terminate the server on a fatal finding.")
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option("--timeout", help="Stop watching after S seconds; the server keeps running."),
    ] = None,
    stop_at_timeout: Annotated[
        bool, typer.Option("--stop-at-timeout", help="At --timeout, stop the server too.")
    ] = False,
    budget: BudgetOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the final diagnosis as JSON.")] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", help="Do not echo the server's output (it still goes to --log).")
    ] = False,
    grace: Annotated[
        float,
        typer.Option(
            "--grace",
            help="Seconds a server may keep running after a fatal verdict before its process group is stopped.",
        ),
    ] = 30.0,
    termination_log: Annotated[
        str | None,
        typer.Option(
            "--termination-log",
            help="Write the one-line verdict here at the end (Kubernetes: /dev/termination-log, ≤ 4 KB).",
        ),
    ] = None,
    engine: EngineOpt = None,
    rules: RulesOpt = None,
) -> None:
    """Start a server (`diagnose run -- vllm serve …`), tee its output, and diagnose it live."""
    from ..live.child import run_child

    cmd = list(ctx.args)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise typer.BadParameter("give the server command after --, e.g. diagnose run -- vllm serve MODEL")
    at_least("--timeout", timeout, 0.001)
    at_least("--grace", grace, 0)
    if termination_log is not None:  # refused now, before the server starts, not after an hour
        _write_termination(termination_log, None)
    session_cls, kwargs, rules = _live_setup(engine, rules, None, budget, False)
    session = session_cls(load_knowledge(rules), log or "server", **kwargs)
    console = make_console()
    said: list = []  # type: ignore[type-arg]
    say_now = _say_now(console, json_out, grace, said)
    verdict, child_rc, started = run_child(
        cmd,
        session,
        console,
        log,
        stop_on_failure,
        timeout,
        json_out,
        echo=not quiet,
        on_verdict=say_now,
        grace=grace,
        stop_at_timeout=stop_at_timeout,
    )
    raise typer.Exit(_after_run(verdict, child_rc, started, said, json_out, console, termination_log))


def _after_run(verdict, child_rc, started, said, json_out, console, termination_log) -> int:  # type: ignore[no-untyped-def]
    """`run`'s end: the verdict (unless said while the server ran), the termination log, the
    server's exit code as a shell says it (or that it still runs)."""
    if said and not json_out and verdict is said[0]:
        rc = EXIT_FOUND  # already printed in full
    else:
        rc = _finish_live(verdict, json_out, console, started)
    if termination_log is not None:
        try:
            _write_termination(termination_log, verdict)
        except InputError as e:
            say_error(str(e))
    if not json_out:
        console.print(
            Text(
                f"  server exit code: {child_rc}" if child_rc is not None else "  server still running",
                style="dim",
            )
        )
    return rc


def _say_now(console: Console, json_out: bool, grace: float, said: list):  # type: ignore[no-untyped-def,type-arg]
    """`run`'s verdict the moment it is known; the server keeps running (Ctrl-C stops it)."""

    def say_now(v, alive: bool = True) -> None:  # type: ignore[no-untyped-def]
        from ..outputs.styled import print_styled
        from ..outputs.text import render_text

        if not json_out:
            print_styled(render_text(v.diagnosis), console)
            if alive:  # said only while it is true
                console.print(
                    Text(
                        f"  the server is still up: it is stopped in {grace:.0f} s unless it exits (Ctrl-C now)",
                        style="dim",
                    )
                )
        said.append(v)

    return say_now


def _write_termination(path: str, verdict) -> None:  # type: ignore[no-untyped-def]
    """The one-line verdict at `path` (None: only check that it can be written)."""
    from ..fleet.termination import message, write

    try:
        if verdict is None:
            with open(path, "a", encoding="utf-8"):
                pass
        else:
            write(path, message(verdict.diagnosis, verdict.kind))
    except OSError as e:
        raise InputError(f"{path}: cannot write the termination log: {e.strerror or e}") from None
