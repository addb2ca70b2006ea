"""`diagnose stream` and `diagnose k8s`, and the fleet options `watch --glob` shares."""

from typing import Annotated, Any

from ..base.errors import (
    EXIT_FOUND,
    EXIT_OK,
    InputError,
    say_warning,
)
from .app import BudgetOpt, EngineOpt, RulesOpt, app, at_least, print_columns
from .fast_scan import load_knowledge
from .lean_typer import typer

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
AlertRepostOpt = Annotated[
    float,
    typer.Option(
        "--alert-repost",
        help="Re-post firing alerts every S seconds (endsAt 3×S ahead), well inside Alertmanager's resolve_timeout.",
    ),
]
IncludeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--include",
        help="Follow only sources matching: a glob over the source (llm/*/engine) or a label "
        "(namespace=llm, pod=vllm-*, container=engine); repeatable.",
    ),
]
ExcludeOpt = Annotated[
    list[str] | None, typer.Option("--exclude", help="Never follow sources matching (as --include).")
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
        list[str] | None,
        typer.Option(
            "--key",
            help="A JSON field (a dotted path) that tells sources apart, for other shapes; several "
            "(repeated, or a,b): each a part of the identity.",
        ),
    ] = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--source", help="The name of plain-text and CRI input (default: its file's, `-` for stdin)."
        ),
    ] = None,
    max_sessions: MaxSessionsOpt = 10_000,
    idle: IdleCloseOpt = None,
    events: EventsOpt = None,
    summary: SummaryOpt = False,
    metrics_port: MetricsPortOpt = None,
    metrics_addr: MetricsAddrOpt = "127.0.0.1",
    alertmanager: AlertmanagerOpt = None,
    alert_repost: AlertRepostOpt = 60.0,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    budget: BudgetOpt = None,
    engine: EngineOpt = None,
    rules: RulesOpt = None,
) -> None:
    """Log records of many servers in (Vector, Fluent Bit, OTLP, Loki, CRI, text): a JSON verdict line per change of each."""
    from ..fleet.stream_command import run_stream

    fleet = Fleet(max_sessions, idle, events, summary, metrics_port, metrics_addr, alertmanager, budget)
    fleet.scope(include, exclude, alert_repost)
    raise typer.Exit(
        fleet.run(
            lambda sessions, out: run_stream(inputs or ["-"], sessions, key, source, out), engine, rules
        )
    )


class Fleet:
    """What `stream` and `watch --glob` share: the sessions, the output, metrics and alerts."""

    def __init__(self, max_sessions, idle, events, summary, metrics_port, metrics_addr, alertmanager, budget):  # type: ignore[no-untyped-def]
        from ..live.session import parse_budgets
        from ..stream.session import EVENT_KINDS

        at_least("--max-sessions", max_sessions, 1)
        at_least("--idle", idle, 0.001)
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

    def scope(self, include: list[str] | None, exclude: list[str] | None, alert_repost: float = 60.0) -> None:
        """What the fleet follows (--include/--exclude) and how often firing alerts are re-posted."""
        from ..fleet.scope import Scope

        at_least("--alert-repost", alert_repost, 1)
        self._scope = Scope(list(include or []), list(exclude or []))
        self._repost = alert_repost

    def run(self, body, engine, rules) -> int:  # type: ignore[no-untyped-def]
        """`body(sessions, output)` with the sinks running; problems posting said at the end."""
        from ..fleet.stream_command import BUSY_HOLD_S, Output
        from ..stream.session import Sessions

        sessions = Sessions(
            load_knowledge(rules),
            engine,
            self.max_sessions,
            self.idle,
            self.budgets,
            hold_s=BUSY_HOLD_S,
            scoped=True,
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

            poster = AlertPoster(self.alertmanager, getattr(self, "_repost", 60.0))
            sinks.append(lambda e, _n: poster.take(e))
        try:
            output = Output(self.only, self.summary, sinks=sinks, scope=getattr(self, "_scope", None))
            output.stop = _stop_on_sigterm()
            return int(body(sessions, output))
        finally:
            if poster is not None:
                poster.close()
                for problem in poster.errors[:3]:
                    say_warning(f"alert not posted: {problem}")
                if poster.dropped:
                    say_warning(f"{poster.dropped} alert(s) dropped: Alertmanager did not keep up")


def _stop_on_sigterm() -> Any:
    """A DaemonSet rollout's SIGTERM ends the loop as the input's end would: the verdicts the
    sessions hold are flushed (closed events, metrics, alerts) before the exit."""
    import contextlib
    import signal
    import threading

    stop = threading.Event()
    with contextlib.suppress(ValueError):  # not the main thread (a test's runner): no handler
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


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
        print_columns(("pod", "container", "status", "class", "phase", "restarts", "next change"), rows)
    bad = any(v.status in ("failed", "pending", "degraded") for v in verdicts)
    raise typer.Exit(EXIT_FOUND if bad else EXIT_OK)
