"""`diagnose probe` (and `--sweep`): the probe part's requests behind their options, printed."""

import os
import sys
from typing import Annotated, Any

from rich.console import Console
from rich.text import Text

from ..base.errors import (
    EXIT_FOUND,
    EXIT_OK,
)
from .app import app, at_least, make_console
from .lean_typer import typer

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
        at_least(hint, v, low)
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
    c = make_console()
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

    from ..probe.sweep import Sweep, run_sweep
    from ..probe.sweep_compare import compare_sweep, read_sweep_baseline, save_sweep

    if compare:
        read_sweep_baseline(compare)  # a wrong path or file is told before the sweep, not after

    result = Sweep()
    if res.ok:
        args = (res.url, res.model, levels, prompt, max_tokens, chat, per_level, max_requests, sweep_time)
        result = _sweep_with_progress(args, timeouts, sent, not json_out and sys.stderr.isatty())
        if compare:

            def repeat(c: int) -> Any:  # the step again, to tell a regression from noise
                once = (
                    res.url,
                    res.model,
                    [c],
                    prompt,
                    max_tokens,
                    chat,
                    per_level,
                    max_requests,
                    sweep_time,
                )
                again = run_sweep(*once, timeouts, sent, None)
                return again.steps[0] if again.steps else None

            compare_sweep(result, compare, tolerance, repeat)
        if save and result.steps:
            save_sweep(result, save, res.url, res.model)
    ok = res.ok and not result.regressions and bool(result.steps)
    if json_out:
        out = res.to_json()
        out["ok"] = ok
        out["sweep"] = result.to_json()
        print(json.dumps(out, indent=2, ensure_ascii=False))
    elif not res.ok:
        c = make_console()
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
    c = make_console()
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
