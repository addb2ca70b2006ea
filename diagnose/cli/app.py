"""Command line: one function per command, no logic of its own.

No `from __future__ import annotations` here: typer reads every command's signature at each
start, and string annotations made it `eval` each of them (~10 ms of every `--help`)."""

import os
import re
import sys
from enum import StrEnum
from typing import Annotated, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..base.errors import (
    EXIT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    InputError,
    run_guarded,
    say_error,
    say_warning,
    yaml_problem,
)
from ..outputs.registry import OUTPUTS
from .lean_typer import typer
from .scan import load_kb, load_knowledge, run_scan

app = typer.Typer(
    help="Troubleshoot LLM inference servers (vLLM, SGLang, TGI) from their logs.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
rules_app = typer.Typer(help="List, explain and test the rules.", no_args_is_help=True)
app.add_typer(rules_app, name="rules")
kb_app = typer.Typer(help="The knowledge base of past incidents.", no_args_is_help=True)
app.add_typer(kb_app, name="kb")


Format = StrEnum("Format", {name: name for name in OUTPUTS})  # type: ignore[misc]  # the outputs' registry


def _console() -> Console:
    # on a pipe nothing wraps: one record per line, as grep and awk expect
    wide = None if sys.stdout is not None and sys.stdout.isatty() else 100_000
    return Console(highlight=False, soft_wrap=True, width=wide)


def _at_least(hint: str, value: float | None, low: float) -> None:
    """A count or size that must be at least `low` (and a number): a usage error otherwise."""
    import math

    if value is not None and (math.isnan(value) or value < low):
        raise typer.BadParameter(f"{value!r} is not allowed: it must be at least {low:g}", param_hint=hint)


def _fraction(hint: str, value: float | None) -> None:
    """A share of memory: in (0, 1]."""
    import math

    if value is not None and (math.isnan(value) or not 0 < value <= 1):
        raise typer.BadParameter(
            f"{value!r} is not a fraction: give a value in (0, 1], e.g. 0.9", param_hint=hint
        )


RulesOpt = Annotated[list[str] | None, typer.Option("--rules", help="Extra rules directory (repeatable).")]
KbOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--kb", help="Incident store(s); the first is written to (default: DIAGNOSE_KB or the user's)."
    ),
]
EngineOpt = Annotated[
    str | None,
    typer.Option("--engine", help="Force the engine: a profile name (`diagnose rules list` shows them)."),
]


@app.command()
def scan(
    files: Annotated[
        list[str] | None, typer.Argument(help="Log files (.gz too); '-' or none reads stdin.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the schema-1 JSON diagnosis.")] = False,
    fmt: Annotated[Format, typer.Option("--format", help="text, json or markdown.")] = Format.text,
    engine: EngineOpt = None,
    rules: RulesOpt = None,
    gpus: Annotated[
        str | None,
        typer.Option("--gpus", help="nvidia-smi output (CSV query, table or -q) to cross-check against."),
    ] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Show every finding.")] = False,
    kb: KbOpt = None,
    config: Annotated[
        str | None, typer.Option("--config", help="The model's config.json: adds the memory arithmetic.")
    ] = None,
    merge: Annotated[
        bool,
        typer.Option(
            "--merge", help="Several files are the logs of one run (nodes, ranks): one diagnosis, by time."
        ),
    ] = False,
    show_secrets: Annotated[
        bool,
        typer.Option("--show-secrets", help="Print tokens, keys and passwords found in the log (local use)."),
    ] = False,
    chart: Annotated[
        bool,
        typer.Option("--chart", help="Draw the KV-cache and queue chart of the serving phase in pipes too."),
    ] = False,
) -> None:
    """Read server logs and say what failed, when, and the next change to make (one report per file)."""
    # the same checks as scan_command.read_scan_argv, which hands these cases here
    if not files and sys.stdin is not None and sys.stdin.isatty():
        raise typer.BadParameter(
            "no log given: pass a file, or pipe the log into diagnose", param_hint="FILES"
        )
    rc = run_scan(
        files, fmt.value, json_out, show_all, engine, rules, gpus, kb, config, merge, show_secrets, chart
    )
    raise typer.Exit(rc)


@app.command()
def device(
    file: Annotated[
        str | None, typer.Argument(help="nvidia-smi output; '-' reads stdin; none runs nvidia-smi.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the device JSON.")] = False,
    parallel: Annotated[
        int | None, typer.Option("--tp", help="The tensor × pipeline parallel size you plan to launch with.")
    ] = None,
    visible: Annotated[
        str | None,
        typer.Option(
            "--visible-devices", help="CUDA_VISIBLE_DEVICES to apply (default: this environment's)."
        ),
    ] = None,
) -> None:
    """The GPUs in one line: count, model, memory, use, drivers; then what stands in the way."""
    _at_least("--tp", parallel, 1)
    import json

    from ..host.gpus import apply_visible_devices
    from ..host.nvidia_smi import parse_nvidia_smi, query_live

    piped = ""
    if file in (None, "-") and sys.stdin is not None and not sys.stdin.isatty():
        piped = sys.stdin.read(4 << 20)
    if file == "-" or (file is None and piped.strip()):
        snap = parse_nvidia_smi(piped)
    elif file is None:
        snap = query_live()
    else:
        try:
            with open(file, encoding="utf-8", errors="replace") as f:
                text = f.read(4 << 20)
        except OSError as e:
            raise InputError(f"{file}: cannot read: {e.strerror or e}") from None
        snap = parse_nvidia_smi(text)
    cvd = visible if visible is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    snap = apply_visible_devices(snap, cvd)
    warnings = snap.warnings(parallel)
    if json_out:
        print(json.dumps(snap.to_json(parallel), indent=2))
    else:
        c = _console()
        c.print(Text(snap.summary(), style="bold"))
        for w in warnings:
            c.print(Text(f"  ! {w.kind}: {w.text}", style="yellow"))
    raise typer.Exit(EXIT_FOUND if warnings else EXIT_OK)


BudgetOpt = Annotated[
    list[str] | None,
    typer.Option("--budget", help="Hang budget: PHASE=SECONDS (repeatable) or SECONDS for every phase."),
]


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
            console.print(Text(f"ready in {time.monotonic() - started:.0f} s", style="bold green"))
        elif verdict.kind == "timeout":
            console.print(
                Text("gave up waiting (--timeout): the server is not ready yet", style="bold yellow")
            )
        elif verdict.kind == "interrupted":
            console.print(Text("stopped watching (Ctrl-C): the log so far", style="bold yellow"))
        elif verdict.kind == "stopped":
            console.print(Text("stopped at --timeout: the server had become ready", style="bold green"))
        print_styled(render_text(d), console)
    if verdict.kind in ("ready", "stopped") or (
        verdict.kind == "ended" and d.status in ("ready", "incomplete")
    ):
        return EXIT_OK
    return EXIT_FOUND


# the options of the fleet commands (stream, watch --glob), named once
MaxSessionsOpt = Annotated[
    int, typer.Option("--max-sessions", help="Sources followed at once (the idlest is closed beyond).")
]
IdleCloseOpt = Annotated[
    float | None, typer.Option("--idle", help="Close a source quiet for S seconds (its final verdict).")
]
EventsOpt = Annotated[
    str | None,
    typer.Option(
        "--events",
        help="Only these events, comma-separated (phase,finding,ready,failed,stopped,hang,closed).",
    ),
]
SummaryOpt = Annotated[
    bool,
    typer.Option("--summary", help="At the end, one line rolling the verdicts up by class, model, node."),
]
MetricsPortOpt = Annotated[
    int | None, typer.Option("--metrics-port", help="Serve Prometheus metrics on this port (/metrics).")
]
MetricsAddrOpt = Annotated[
    str, typer.Option("--metrics-addr", help="The address to serve them on (0.0.0.0: every interface).")
]
AlertmanagerOpt = Annotated[
    str | None,
    typer.Option("--alertmanager", help="Post failures as alerts to this Alertmanager (its base URL)."),
]


@app.command()
def stream(
    inputs: Annotated[
        list[str] | None, typer.Argument(help="Files of records (default: standard input, or `-`).")
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key", help="The JSON field (a dotted path) that tells sources apart, for other shapes."
        ),
    ] = None,
    source: Annotated[str, typer.Option("--source", help="The name of plain-text and CRI input.")] = "-",
    max_sessions: MaxSessionsOpt = 10_000,
    idle: IdleCloseOpt = None,
    events: EventsOpt = None,
    summary: SummaryOpt = False,
    metrics_port: MetricsPortOpt = None,
    metrics_addr: MetricsAddrOpt = "127.0.0.1",
    alertmanager: AlertmanagerOpt = None,
    budget: BudgetOpt = None,
    engine: EngineOpt = None,
    rules: RulesOpt = None,
) -> None:
    """Log records of many servers in (Vector, Fluent Bit, OTLP, Loki, CRI, text): a JSON verdict line per change of each."""
    from ..fleet.stream_command import run_stream

    fleet = _Fleet(max_sessions, idle, events, summary, metrics_port, metrics_addr, alertmanager, budget)
    raise typer.Exit(
        fleet.run(
            lambda sessions, out: run_stream(inputs or ["-"], sessions, key, source, out), engine, rules
        )
    )


class _Fleet:
    """What `stream` and `watch --glob` share: the sessions, the output, metrics and alerts."""

    def __init__(self, max_sessions, idle, events, summary, metrics_port, metrics_addr, alertmanager, budget):  # type: ignore[no-untyped-def]
        from ..live.session import parse_budgets
        from ..stream.session import EVENT_KINDS

        _at_least("--max-sessions", max_sessions, 1)
        _at_least("--idle", idle, 0.001)
        self.only = None
        if events is not None:
            self.only = {e.strip() for e in events.split(",") if e.strip()}
            unknown = sorted(self.only - set(EVENT_KINDS))
            if unknown:
                raise typer.BadParameter(
                    f"unknown event {', '.join(unknown)} (events: {', '.join(EVENT_KINDS)})",
                    param_hint="--events",
                )
        try:  # hangs only when asked: a replay runs faster than time
            self.budgets = parse_budgets(budget) if budget else None
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--budget") from None
        if metrics_port is not None and not 0 <= metrics_port <= 65535:
            raise typer.BadParameter(f"{metrics_port} is not a port", param_hint="--metrics-port")
        if alertmanager is not None and not alertmanager.startswith(("http://", "https://")):
            raise typer.BadParameter(f"{alertmanager!r} is not an http(s) URL", param_hint="--alertmanager")
        self.max_sessions, self.idle, self.summary = max_sessions, idle, summary
        self.metrics_port, self.metrics_addr, self.alertmanager = metrics_port, metrics_addr, alertmanager

    def run(self, body, engine, rules) -> int:  # type: ignore[no-untyped-def]
        """`body(sessions, output)` with the sinks running; problems posting said at the end."""
        from ..fleet.stream_command import BUSY_HOLD_S, Output
        from ..stream.session import Sessions

        sessions = Sessions(
            load_knowledge(rules), engine, self.max_sessions, self.idle, self.budgets, hold_s=BUSY_HOLD_S
        )
        sinks = []
        poster = None
        if self.metrics_port is not None:
            from ..fleet.alerts import StreamMetrics

            metrics = StreamMetrics()
            try:
                metrics.serve(self.metrics_port, self.metrics_addr)
            except OSError as e:
                raise InputError(
                    f"--metrics-port {self.metrics_port}: cannot listen on {self.metrics_addr}: {e.strerror or e}"
                ) from None
            sinks.append(metrics.take)
        if self.alertmanager is not None:
            from ..fleet.alerts import AlertPoster

            poster = AlertPoster(self.alertmanager)
            sinks.append(lambda e, _n: poster.take(e))
        try:
            return int(body(sessions, Output(self.only, self.summary, sinks=sinks)))
        finally:
            if poster is not None:
                poster.close()
                for problem in poster.errors[:3]:
                    say_warning(f"alert not posted: {problem}")
                if poster.dropped:
                    say_warning(f"{poster.dropped} alert(s) dropped: Alertmanager did not keep up")


@app.command()
def k8s(
    namespace: Annotated[
        str, typer.Option("--namespace", "-n", help="The namespace of the pods.")
    ] = "default",
    selector: Annotated[
        str | None, typer.Option("--selector", "-l", help="A label selector, e.g. app=vllm.")
    ] = None,
    kubeconfig: Annotated[
        str | None,
        typer.Option("--kubeconfig", help="The kubeconfig (default: in-cluster, then ~/.kube/config)."),
    ] = None,
    context: Annotated[str | None, typer.Option("--context", help="The kubeconfig context.")] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="One JSON object a container (a JSON array).")
    ] = False,
    emit_events: Annotated[
        bool, typer.Option("--emit-events", help="Also write each verdict as a Kubernetes Event on its pod.")
    ] = False,
    rules: RulesOpt = None,
) -> None:
    """Pods of an inference server: each container's log (the previous one after a restart), its last termination and the pod's events, joined into one verdict."""
    import json

    from ..fleet.k8s import api_client, emit_event, examine
    from ..fleet.termination import fit
    from ..model.records import Change
    from ..outputs.text import change_text

    api = api_client(kubeconfig, context)
    verdicts = examine(api, load_knowledge(rules), namespace, selector)
    if emit_events:
        for v in verdicts:
            try:
                emit_event(api, v, fit(f"diagnose: {v.status} {v.cls or ''}: {v.evidence}", 1024))
            except Exception as e:  # an API refusal (RBAC) is said, the verdicts still printed
                say_warning(f"event not written on {v.namespace}/{v.pod}: {getattr(e, 'reason', e)}")
    if json_out:
        print(json.dumps([v.to_json() for v in verdicts], ensure_ascii=False, indent=2))
    elif not verdicts:
        print(f"no pods in {namespace}" + (f" with {selector}" if selector else ""))
    else:
        rows = []
        for v in verdicts:
            change = " ".join(change_text(Change.from_json(v.change)).split()) if v.change else ""
            rows.append(
                (v.pod, v.container, v.status, v.cls or "—", v.phase or "—", str(v.restarts), change or "—")
            )
        _print_columns(("pod", "container", "status", "class", "phase", "restarts", "next change"), rows)
    bad = any(v.status in ("failed", "pending", "degraded") for v in verdicts)
    raise typer.Exit(EXIT_FOUND if bad else EXIT_OK)


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
) -> None:
    """Follow a startup log live: phases as they pass, a verdict on the first fatal line, ready, or a hang."""
    import time

    if glob is not None:
        if file is not None:
            raise typer.BadParameter("give a FILE or --glob PATTERN, not both", param_hint="--glob")
        from ..fleet.node_agent import NodeAgent
        from ..fleet.stream_command import run_agent

        _at_least("--interval", interval, 0.01)
        _at_least("--timeout", timeout, 0.001)
        fleet = _Fleet(max_sessions, idle, events, False, metrics_port, metrics_addr, alertmanager, budget)
        agent = NodeAgent(glob, from_end=from_end, node=node)
        raise typer.Exit(
            fleet.run(lambda sessions, out: run_agent(agent, sessions, out, interval, timeout), engine, rules)
        )
    if file is None:
        raise typer.BadParameter("give the log to follow (or --glob PATTERN for every log of a node)")
    _check_followable(file)
    from ..live.follow import Follower
    from ..live.session import make_progress

    _at_least("--timeout", timeout, 0.001)
    session_cls, kwargs, rules = _live_setup(engine, rules, gpus, budget, follow)
    session = session_cls(load_knowledge(rules), file, **kwargs)
    console = _console()
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
        float | None, typer.Option("--timeout", help="Give up watching after S seconds.")
    ] = None,
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
    _at_least("--timeout", timeout, 0.001)
    _at_least("--grace", grace, 0)
    if termination_log is not None:  # refused now, before the server starts, not after an hour
        _write_termination(termination_log, None)
    session_cls, kwargs, rules = _live_setup(engine, rules, None, budget, False)
    session = session_cls(load_knowledge(rules), log or "server", **kwargs)
    console = _console()
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
    )
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
    raise typer.Exit(rc)


def _say_now(console: Console, json_out: bool, grace: float, said: list):  # type: ignore[no-untyped-def,type-arg]
    """`run`'s verdict the moment it is known; the server keeps running (Ctrl-C stops it)."""

    def say_now(v) -> None:  # type: ignore[no-untyped-def]
        from ..outputs.styled import print_styled
        from ..outputs.text import render_text

        if not json_out:
            print_styled(render_text(v.diagnosis), console)
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


# probe's options, named once
_UrlArg = Annotated[str, typer.Argument(help="The server's base URL.")]
_ModelOpt = Annotated[
    str | None, typer.Option("--model", help="Model name (default: the first of /v1/models).")
]
_ChatOpt = Annotated[bool, typer.Option("--chat", help="Use /v1/chat/completions.")]
_PromptOpt = Annotated[str, typer.Option("--prompt", help="The prompt to send.")]
_MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", help="Tokens to generate.")]
_ConnectOpt = Annotated[float, typer.Option("--connect-timeout", help="Seconds to connect.")]
_FirstByteOpt = Annotated[
    float, typer.Option("--first-byte-timeout", help="Seconds to wait for the first byte.")
]
_IdleOpt = Annotated[float, typer.Option("--idle-timeout", help="Longest tolerated gap in a stream.")]
_SaveOpt = Annotated[str | None, typer.Option("--save-baseline", help="Store the figures here.")]
_BaselineOpt = Annotated[str | None, typer.Option("--baseline", help="Compare with a stored baseline.")]
_ToleranceOpt = Annotated[
    float | None,
    typer.Option(
        "--tolerance", help="Allowed regression (default 0.25; 0.15 for a sweep).", show_default=False
    ),
]
_SweepOpt = Annotated[
    str | None,
    typer.Option(
        "--sweep", help="Concurrency levels, e.g. 1,2,4,8,16,32: find the knee.", show_default=False
    ),
]
_PerLevelOpt = Annotated[
    int | None, typer.Option("--per-level", help="Requests at each level (default max(8, 2×level)).")
]
_MaxRequestsOpt = Annotated[
    int, typer.Option("--max-requests", help="At most this many requests in a sweep.")
]
_SweepTimeOpt = Annotated[float, typer.Option("--sweep-time", help="Seconds a sweep may take.")]
_CompareOpt = Annotated[
    str | None, typer.Option("--compare", help="A saved sweep: report regressions against it.")
]
_LongOpt = Annotated[
    int | None,
    typer.Option(
        "--long",
        help="Also send one prompt of about N tokens (0: close to the server's max_model_len).",
        show_default=False,
    ),
]
_ApiKeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", help="The server's API key (default: $OPENAI_API_KEY).", show_default=False),
]
_HeaderOpt = Annotated[
    list[str] | None, typer.Option("--header", help="An extra header, 'Name: value' (repeatable).")
]


@app.command()
def probe(
    url: _UrlArg = "http://127.0.0.1:8000",
    model: _ModelOpt = None,
    chat: _ChatOpt = False,
    prompt: _PromptOpt = "你好",
    max_tokens: _MaxTokensOpt = 16,
    connect_timeout: _ConnectOpt = 5.0,
    first_byte_timeout: _FirstByteOpt = 120.0,
    idle_timeout: _IdleOpt = 30.0,
    save_baseline: _SaveOpt = None,
    baseline: _BaselineOpt = None,
    tolerance: _ToleranceOpt = None,
    sweep: _SweepOpt = None,
    per_level: _PerLevelOpt = None,
    max_requests: _MaxRequestsOpt = 2000,
    sweep_time: _SweepTimeOpt = 600.0,
    compare: _CompareOpt = None,
    long: _LongOpt = None,
    api_key: _ApiKeyOpt = None,
    header: _HeaderOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the probe JSON.")] = False,
) -> None:
    """Send the minimal completion and check that the server really serves: shape, text, timing."""
    import json

    from ..probe.baseline import compare_baseline
    from ..probe.baseline import save_baseline as store
    from ..probe.completion import probe as run_probe
    from ..probe.result import Timeouts

    if not url.startswith(("http://", "https://")):
        raise typer.BadParameter("the URL must start with http:// or https://", param_hint="URL")
    from urllib.parse import urlsplit

    try:
        urlsplit(url).port  # noqa: B018 - raises for a port outside 0–65535 or not a number
    except ValueError:
        raise typer.BadParameter(
            f"{url}: the port must be a number from 1 to 65535", param_hint="URL"
        ) from None
    for hint, v, low in (
        ("--max-tokens", max_tokens, 1),
        ("--connect-timeout", connect_timeout, 0.001),
        ("--first-byte-timeout", first_byte_timeout, 0.001),
        ("--idle-timeout", idle_timeout, 0.001),
        ("--tolerance", tolerance, 0),
        ("--per-level", per_level, 1),
        ("--long", long, 0),
        ("--max-requests", max_requests, 1),
        ("--sweep-time", sweep_time, 1),
    ):
        _at_least(hint, v, low)
    levels = _levels(sweep) if sweep is not None else None
    if compare and not levels:
        raise typer.BadParameter("--compare reads a saved sweep: give --sweep too", param_hint="--compare")
    sent = _auth_headers(_parsed_headers(header), api_key)  # one set of headers for every request sent
    timeouts = Timeouts(connect_timeout, first_byte_timeout, idle_timeout)
    res = run_probe(url, model, prompt, max_tokens, chat, timeouts, headers=sent)
    if long is not None and res.ok:
        from ..probe.completion import long_request

        long_request(res.url, res, long or None, chat, timeouts, sent)
    if levels:
        tol = 0.15 if tolerance is None else tolerance
        sweep_args = (levels, prompt, max_tokens, chat, per_level, max_requests, sweep_time, timeouts, sent)
        raise typer.Exit(_run_sweep(res, *sweep_args, save_baseline, compare, tol, json_out))
    if baseline and res.ok:
        compare_baseline(res, baseline, 0.25 if tolerance is None else tolerance)
    if save_baseline and res.ok:
        store(res, save_baseline)
    if json_out:
        print(json.dumps(res.to_json(), indent=2, ensure_ascii=False))
    else:
        _print_probe(res)
    raise typer.Exit(EXIT_OK if res.ok else EXIT_FOUND)


def _parsed_headers(given: list[str] | None) -> dict[str, str]:
    headers: dict[str, str] = {}
    for h in given or []:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            raise typer.BadParameter(f"{h!r}: give 'Name: value'", param_hint="--header")
        headers[name.strip()] = value.strip()
    return headers


def _print_probe(res: Any) -> None:
    c = _console()
    head = "✓ serves" if res.ok else "✗ does not serve"
    c.print(
        Text(
            f"{head}: {res.url}" + (f"  model {res.model}" if res.model else ""),
            style="bold green" if res.ok else "bold red",
        )
    )
    for ch in res.checks:
        mark, style = ("✓", "green") if ch.ok else ("✗", "red")
        value = "" if ch.value is None else f"  {ch.value}"
        c.print(Text.assemble((f"  {mark} {ch.name:<16}", style), value, (f"  {ch.detail}", "dim")))
    timing = [
        f"{label} {v:.0f} ms" if unit == "ms" else f"{label} {v:.1f} tokens/s"
        for label, v, unit in (
            ("TTFT", res.ttft_ms, "ms"),
            ("total", res.total_ms, "ms"),
            ("decode", res.tokens_per_s, "tok"),
        )
        if v is not None
    ]
    if timing:
        c.print(Text("  " + " · ".join(timing)))
    for n in res.notes:
        c.print(Text(f"  note: {n}", style="dim"))
    if res.cause:
        from ..outputs.text import change_text

        c.print()
        c.print(Text(f"  cause  {res.cause.title}", style="bold"))
        for ch in res.cause.changes[:3]:  # what the scan would change for the same message
            c.print(Text.assemble(("  change ", "bold"), (change_text(ch), "green"), (f"  {ch.why}", "dim")))
        for a in res.cause.advice:
            c.print(Text(f"  next   {a}"))


def _auth_headers(headers: dict[str, str], api_key: str | None) -> dict[str, str]:
    """The extra headers, with the API key (or $OPENAI_API_KEY) as a bearer token."""
    sent = dict(headers)
    key = api_key or os.environ.get("OPENAI_API_KEY")
    if key:
        sent["Authorization"] = f"Bearer {key}"
    return sent


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: give concurrency levels like 1,2,4,8", param_hint="--sweep"
        ) from None
    if not levels or any(c < 1 or c > 1024 for c in levels) or levels != sorted(set(levels)):
        raise typer.BadParameter(
            f"{text!r}: increasing levels between 1 and 1024, e.g. 1,2,4,8", param_hint="--sweep"
        )
    return levels


def _run_sweep(
    res: Any,
    levels: list[int],
    prompt: str,
    max_tokens: int,
    chat: bool,
    per_level: int | None,
    max_requests: int,
    sweep_time: float,
    timeouts: Any,
    sent: dict[str, str],
    save: str | None,
    compare: str | None,
    tolerance: float,
    json_out: bool,
) -> int:
    """The concurrency sweep after a probe that passed: steps, knee, bound, regressions."""
    import json

    from ..probe.sweep import Sweep, compare_sweep, read_sweep_baseline, save_sweep

    if compare:
        read_sweep_baseline(compare)  # a wrong path or file is told before the sweep, not after

    result = Sweep()
    if res.ok:
        args = (res.url, res.model, levels, prompt, max_tokens, chat, per_level, max_requests, sweep_time)
        result = _sweep_with_progress(args, timeouts, sent, not json_out and sys.stderr.isatty())
        if compare:
            compare_sweep(result, compare, tolerance)
        if save and result.steps:
            save_sweep(result, save, res.url, res.model)
    ok = res.ok and not result.regressions and bool(result.steps)
    if json_out:
        out = res.to_json()
        out["ok"] = ok
        out["sweep"] = result.to_json()
        print(json.dumps(out, indent=2, ensure_ascii=False))
    elif not res.ok:
        c = _console()
        c.print(Text(f"✗ does not serve: {res.url}: no sweep", style="bold red"))
        if res.cause:
            c.print(Text(f"  cause  {res.cause.title}", style="bold"))
    else:
        _print_sweep(res, result)
    return EXIT_OK if ok else EXIT_FOUND


def _sweep_with_progress(args: tuple[Any, ...], timeouts: Any, sent: dict[str, str], bar: bool) -> Any:
    """run_sweep, with a progress bar on a terminal's stderr (`bar`)."""
    from ..probe.sweep import run_sweep

    if not bar:
        return run_sweep(*args, timeouts, sent, None)
    from rich.progress import Progress

    progress = Progress(console=Console(stderr=True), transient=True)
    task = progress.add_task("sweep", total=1)

    def update(done: int, total: int, c: int) -> None:
        progress.update(task, completed=done, total=total, description=f"concurrency {c}")

    progress.start()
    try:
        return run_sweep(*args, timeouts, sent, update)
    finally:
        progress.stop()


def _print_sweep(res: Any, result: Any) -> None:
    c = _console()
    c.print(Text(f"sweep: {res.url}" + (f"  model {res.model}" if res.model else ""), style="bold"))
    c.print(Text("  conc  reqs  err  TTFT p50/p99 ms   TPOT p50/p99 ms   req/s   tok/s", style="dim"))
    for s in result.steps:
        mark = "  ◀ knee" if s.concurrency == result.knee else ""
        c.print(
            f"  {s.concurrency:>4}  {s.requests:>4}  {s.errors:>3}  "
            f"{_f(s.ttft_p50_ms):>7}/{_f(s.ttft_p99_ms):<8} {_f(s.tpot_p50_ms):>7}/{_f(s.tpot_p99_ms):<8} "
            f"{_f(s.req_per_s):>6}  {_f(s.tok_per_s):>6}{mark}"
        )
    knee = result.knee if result.knee is not None else "—"
    c.print(Text(f"  knee   {knee}   bound {result.bound}", style="bold"))
    if result.why:
        c.print(Text(f"  {result.why}", style="dim"))
    if result.next_step:
        c.print(Text(f"  next   {result.next_step}", style="green"))
    if result.stopped:
        c.print(Text(f"  note: {result.stopped}", style="yellow"))
    for r in result.regressions:
        c.print(Text(f"  ✗ regression  {r}", style="red"))


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:g}"


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
    c = _console()
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


def _gpus_from(spec: str | None, parallel: int | None = None) -> tuple[int, float, float, str, str | None]:
    """--gpus FILE (an nvidia-smi snapshot) or NxGIB → (count, GiB each, GiB used by others,
    summary, the smallest GPU's model name when a snapshot names it: what the GPUs support)."""
    from ..budget.config import parse_gpus_spec
    from ..pipeline.scan import load_snapshot

    if spec is None:
        n = parallel or 1
        return n, 80.0, 0.0, f"assumed {n}× 80 GiB (give --gpus FILE or --gpus {n}x80)", None
    parsed = parse_gpus_spec(spec)
    if parsed:
        return parsed[0], parsed[1], 0.0, f"{parsed[0]}× {parsed[1]:g} GiB (given)", None
    snap, err = load_snapshot(spec)
    if snap is None:
        raise InputError(f"{spec}: {err}")
    from ..budget.units import CUDA_UNSEEN_GIB

    name = min(snap.gpus, key=lambda g: g.memory_total_mib or 0).name if snap.gpus else None
    mig = [m for g in snap.gpus for m in g.mig_mib]
    if mig:  # a server runs on one MIG instance: the smallest is what is sure to be there
        return (
            1,
            min(mig) / 1024,
            0.0,
            snap.summary() + f"; one MIG instance of {min(mig) / 1024:.1f} GiB",
            name,
        )
    totals = [g.memory_total_mib for g in snap.gpus if g.memory_total_mib]
    if not totals:
        why = (
            "unified memory, shared with the CPU" if any(g.unified for g in snap.gpus) else "no memory column"
        )
        named = re.search(r"(\d+)\s*GB\b", name or "", re.I)
        example = f"{snap.count}x{named.group(1)}" if named else f"{snap.count}xGIB"
        raise InputError(
            f"{spec}: the snapshot gives no memory size ({why}): give the memory the GPU can use, "
            f"e.g. --gpus {example}"
        )
    used = [g.memory_used_mib or 0 for g in snap.gpus]
    smallest = min((g for g in snap.gpus if g.memory_total_mib), key=lambda g: g.memory_total_mib or 0)
    if smallest.memory_reserved_mib is not None:  # -q and memory.reserved say it exactly
        unseen, how = smallest.memory_reserved_mib / 1024, "as the driver reserves"
    else:
        unseen, how = CUDA_UNSEEN_GIB, "typical of the driver's reserve"
    return (
        snap.count,
        (smallest.memory_total_mib or 0) / 1024 - unseen,
        max(used) / 1024 if used else 0.0,
        snap.summary() + f" (CUDA sees {unseen:.2f} GiB less of each than nvidia-smi's total, {how})",
        name,
    )


# plan's options, named once (the command itself reads as what it does)
_PlanConfig = Annotated[str, typer.Option("--config", help="config.json (or the model directory).")]
_PlanWeights = Annotated[
    str | None,
    typer.Option(
        "--weights",
        help="The checkpoint's directory: exact weight bytes from its index or safetensors headers "
        "(default: beside config.json when there).",
    ),
]
_GpusOpt = Annotated[str | None, typer.Option("--gpus", help="nvidia-smi output, or NxGIB such as 2x80.")]
_DtypeOpt = Annotated[str | None, typer.Option("--dtype", help="bf16 or fp16 (default: the config's).")]
_QuantOpt = Annotated[
    str | None, typer.Option("--quantization", help="fp8, int8, awq, gptq, int4 (default: the config's).")
]
_KvDtypeOpt = Annotated[str, typer.Option("--kv-cache-dtype", help="auto or fp8.")]
_TpOpt = Annotated[
    int | None, typer.Option("--tp", help="Tensor-parallel size (default: the smallest that fits).")
]
_PpOpt = Annotated[int, typer.Option("--pp", help="Pipeline-parallel size.")]
_LenOpt = Annotated[int | None, typer.Option("--max-model-len", help="Context length.")]
_SeqsOpt = Annotated[
    int | None,
    typer.Option("--max-num-seqs", help="Concurrent sequences (default: the engine's for the GPU)."),
]
_BatchOpt = Annotated[
    int | None,
    typer.Option("--max-num-batched-tokens", help="Tokens per scheduler step (the profiled batch)."),
]
_VersionOpt = Annotated[
    str | None,
    typer.Option("--engine-version", help="v0, v1 or a vLLM version such as 0.6.6 (the profiled batch)."),
]
_ChunkedOpt = Annotated[
    bool | None,
    typer.Option(
        "--enable-chunked-prefill/--no-enable-chunked-prefill",
        help="V0: whether chunked prefill is on (default: on above 32K context).",
        show_default=False,
    ),
]
_EagerOpt = Annotated[
    bool,
    typer.Option("--enforce-eager", help="No CUDA graphs (vLLM 0.21+ subtracts their memory otherwise)."),
]
_UtilOpt = Annotated[
    float | None, typer.Option("--gpu-memory-utilization", help="Share of each GPU (SGLang: mem fraction).")
]
_EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="Any engine profile: vllm, sglang, lmdeploy, trtllm, tgi, ollama, llamacpp, generic "
        "(each sizes its memory its own way; `rules show ENGINE` says how).",
    ),
]


@app.command()
def plan(
    config: _PlanConfig,
    weights: _PlanWeights = None,
    gpus: _GpusOpt = None,
    dtype: _DtypeOpt = None,
    quantization: _QuantOpt = None,
    kv_cache_dtype: _KvDtypeOpt = "auto",
    tp: _TpOpt = None,
    pp: _PpOpt = 1,
    max_model_len: _LenOpt = None,
    max_num_seqs: _SeqsOpt = None,
    max_num_batched_tokens: _BatchOpt = None,
    engine_version: _VersionOpt = None,
    chunked_prefill: _ChunkedOpt = None,
    eager: _EagerOpt = False,
    util: _UtilOpt = None,
    engine: _EngineOpt = "vllm",
    rules: RulesOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan JSON.")] = False,
) -> None:
    """The memory budget from config.json and the GPUs, and a minimal launch that fits."""
    import json
    from pathlib import Path

    from ..budget.architecture import shape_from_config
    from ..budget.config import checkpoint_quant, load_config
    from ..budget.search import plan as make_plan
    from ..budget.shape import with_checkpoint
    from ..budget.units import engine_units

    units = engine_units(engine, load_knowledge(rules).profiles)
    for name, value in (
        ("--tp", tp),
        ("--pp", pp),
        ("--max-model-len", max_model_len),
        ("--max-num-seqs", max_num_seqs),
        ("--max-num-batched-tokens", max_num_batched_tokens),
    ):
        _at_least(name, value, 1)
    _fraction("--gpu-memory-utilization", util)
    from ..budget.units import KV_CACHE_DTYPES

    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise typer.BadParameter(
            f"{kv_cache_dtype!r} is not a KV-cache type (one of {', '.join(KV_CACHE_DTYPES)})",
            param_hint="--kv-cache-dtype",
        )
    cfg = load_config(config)
    shape = with_checkpoint(
        shape_from_config(cfg, quantization, dtype),
        weights or str(Path(cfg["__path__"]).parent),
        quantization,
        checkpoint_quant(cfg),
    )
    if weights and shape.exact_bytes is None:
        raise InputError(f"{weights}: no model.safetensors.index.json and no *.safetensors files there")
    count, total, used, summary, gpu_name = _gpus_from(gpus, tp)
    sizes = (max_model_len, max_num_seqs, max_num_batched_tokens, kv_cache_dtype, engine)
    p = make_plan(
        shape, count, total, used, tp, pp, util, *sizes, gpu_name=gpu_name, engine_version=engine_version,
        chunked_prefill=chunked_prefill, eager=eager, units=units,
    )  # fmt: skip
    if json_out:
        print(json.dumps(p.to_json(), indent=2, ensure_ascii=False))
    else:
        _print_plan(p, shape, summary, units)
    raise typer.Exit(EXIT_OK if p.fits else EXIT_FOUND)


def _print_plan(p: Any, shape: Any, summary: str, units: Any) -> None:
    c = _console()
    c.print(
        Text(
            f"{'✓ fits' if p.fits else '✗ does not fit'}: {shape.name} on {summary}",
            style="bold green" if p.fits else "bold red",
        )
    )
    t = Table(box=None, show_edge=False)
    t.add_column("per GPU")
    t.add_column("", justify="right")
    for k, v in _plan_rows(p, shape, units):
        t.add_row(k, v)
    c.print(t)
    for r in p.reasons:
        c.print(Text(f"  ✗ {r}", style="red"))
    for w in p.what_would:
        c.print(Text(f"  → {w}" if w.startswith("running as is") else f"  → would fit: {w}", style="green"))
    for a in p.assumptions + shape.partial:
        c.print(Text(f"  · {a}", style="dim"))
    c.print()
    launch = p.to_json()["launch"]
    if launch:
        c.print(Text("  " + launch.replace("\n", "\n  "), style="bold"))
    elif not p.what_would:
        c.print(
            Text(
                "  nothing on these GPUs fits this model: more or larger GPUs, or a smaller model",
                style="bold",
            )
        )


def _plan_rows(p: Any, shape: Any, units: Any) -> list[tuple[str, str]]:
    rows = [
        ("parameters (whole model)", f"{shape.params_total / 1e9:.2f} B"),
        ("weights", f"{p.weights_gib_per_gpu:.2f} GiB"),
        ("activation peak (estimate)", f"{p.activation_gib:.2f} GiB"),
        ("non-torch overhead", f"{p.overhead_gib:.2f} GiB"),
        ("KV-cache budget", f"{p.kv_gib_per_gpu:.2f} GiB"),
        ("KV per token", f"{p.to_json()['kv_bytes_per_token_per_gpu'] / 1024:.1f} KiB"),
        ("KV tokens (per replica)", f"{p.kv_tokens:,}"),
    ]
    if units.kv_budget == "layers":
        return [
            *rows[:2],
            ("compute graph (estimate)", f"{p.activation_gib:.2f} GiB"),
            ("kept free", f"{p.overhead_gib:.2f} GiB"),
            ("KV cache on the GPU", f"{p.kv_gib_per_gpu:.2f} GiB"),
            ("context (tokens)", f"{p.kv_tokens:,}"),
            ("layers on the GPU", f"{p.gpu_layers} of {shape.layers + 1}"),
        ]
    return [
        *rows,
        (f"concurrency at {p.max_model_len:,} tokens", f"{p.max_concurrency:.2f}×"),
        (f"longest context for {p.max_num_seqs} sequences", f"{p.longest_context_for_seqs:,}"),
        ("tensor × pipeline parallel", f"{p.tp} × {p.pp}"),
    ]


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def check(
    ctx: typer.Context,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="nvidia-smi output, or NxGIB such as 2x80.")
    ] = None,
    config: Annotated[
        str | None, typer.Option("--config", help="config.json (default: MODEL/config.json).")
    ] = None,
    engine_version: Annotated[
        str | None,
        typer.Option(
            "--engine-version",
            help="The engine's version (default: the one installed here, if any): v0, v1 or e.g. 0.10.2.",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the check JSON.")] = False,
) -> None:
    """Pre-flight a launch command (`diagnose check -- vllm serve MODEL …`) before it runs."""
    import json

    from ..outputs.json_report import finite
    from ..plan.check import preflight

    cmd = [a for a in ctx.args if a != "--"]
    if not cmd:
        raise typer.BadParameter(
            "give the launch command after --, e.g. diagnose check -- vllm serve MODEL -tp 8"
        )
    count, total, used, summary, gpu_name = (
        _gpus_from(gpus) if gpus else (None, None, 0.0, "no GPU information", None)
    )
    res = preflight(
        cmd,
        config,
        count,
        total,
        used,
        load_knowledge(None).profiles,
        gpu_name=gpu_name,
        engine_version=engine_version,
    )
    if json_out:
        print(json.dumps(finite(res), indent=2, ensure_ascii=False))
    else:
        c = _console()
        c.print(
            Text(
                ("✓ can work" if res["ok"] else "✗ cannot work") + f": {res['summary']}  [{summary}]",
                style="bold green" if res["ok"] else "bold red",
            )
        )
        from ..model.records import Change
        from ..outputs.text import change_text

        for pr in res["problems"]:
            c.print(Text(f"  ✗ {pr['text']}", style="red"))
            if pr["change"]:
                c.print(Text("    → " + change_text(Change.from_json(pr["change"])), style="green"))
        for n in res["notes"]:
            c.print(Text(f"  · {n}", style="dim"))
    raise typer.Exit(EXIT_OK if res["ok"] else EXIT_FOUND)


@rules_app.command("list")
def rules_list(rules: RulesOpt = None) -> None:
    """Every engine profile, then every rule with its class, severity and engines."""
    know = load_knowledge(rules)
    rows = []
    for name in know.engines:
        prof = know.profiles.get(name)
        phases = sorted({m.phase for m in prof.markers if m.what == "phases" and m.phase})
        rows.append((name, prof.title, str(len(phases)), os.path.basename(prof.path) or "(built in)"))
    _print_columns(("engine", "title", "phases", "profile"), rows)
    print()
    rows = [
        (r.id, r.cls or "—", r.severity, ",".join(r.engines), r.title)
        for r in sorted(know.rules.rules, key=lambda r: (r.cls or "~", r.id))
    ]
    _print_columns(("id", "class", "severity", "engines", "title"), rows)
    print()
    _console().print(Text(_mined_summary()))


def _print_columns(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A table: rich's on a terminal (it folds to the width); on a pipe, plain padded columns,
    one record a line (rich measuring every cell of 150 rows took 0.2 s)."""
    if sys.stdout is not None and sys.stdout.isatty():
        table = Table(box=None, pad_edge=False, show_edge=False)
        for col in headers:
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*row)
        _console().print(table)
        return
    widths = [max(len(x) for x in col) for col in zip(headers, *rows, strict=True)]
    for row in (headers, *rows):
        cells = [x.ljust(w) for x, w in zip(row[:-1], widths, strict=False)]
        print(" ".join([*cells, row[-1]]).rstrip())


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
    c = _console()
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
    c = _console()
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
    c = _console()
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
    c = _console()
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


@app.callback(invoke_without_command=True)
def _root(ctx: typer.Context) -> None:
    """With a log piped in and no command, `diagnose` means `diagnose scan -`."""
    if ctx.invoked_subcommand is None:
        if sys.stdin is not None and not sys.stdin.isatty():
            ctx.invoke(
                scan,
                files=["-"],
                json_out=False,
                fmt=Format.text,
                engine=None,
                rules=None,
                gpus=None,
                show_all=False,
                kb=None,
                config=None,
            )
        else:
            typer.echo(ctx.get_help())
            raise typer.Exit(EXIT_USAGE)


def _run_app() -> int:
    try:
        rc = app(standalone_mode=False)
        return rc if isinstance(rc, int) else EXIT_OK
    except typer.Exit as e:
        return int(e.exit_code)
    except typer.Abort:
        raise KeyboardInterrupt from None
    except Exception as e:
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            # click's usage errors (typer vendors click in recent releases): one line, as every
            # other error, with the command and where its help is
            ctx = getattr(e, "ctx", None)
            where = ctx.command_path if ctx is not None else "diagnose"
            say_error(f"{e.format_message()} (see `{where} -h`)")
            return EXIT_USAGE
        raise


def main() -> None:
    """The typer app, under the same error handling as the fast scan (see entry.py)."""
    run_guarded(_run_app)
