"""`diagnose scan` (the typer form of the fast path in `fast_scan`) and `diagnose device`."""

import os
import sys
from typing import Annotated, Any

from rich.text import Text

from ..base.errors import (
    EXIT_FOUND,
    EXIT_OK,
    InputError,
)
from .app import EngineOpt, Format, KbOpt, RulesOpt, app, at_least, make_console
from .fast_scan import run_scan
from .lean_typer import typer


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
    at_least("--tp", parallel, 1)
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
    placed = _placement(snap, parallel) if parallel else None
    if json_out:
        doc = snap.to_json(parallel)
        if placed:
            doc["placement"] = placed
        print(json.dumps(doc, indent=2))
    else:
        c = make_console()
        c.print(Text(snap.summary(), style="bold"))
        for w in warnings:
            c.print(Text(f"  ! {w.kind}: {w.text}", style="yellow"))
        if placed:
            c.print(Text(f"  → {placed['text']}", style="green"))
    raise typer.Exit(EXIT_FOUND if warnings else EXIT_OK)


def _placement(snap: Any, parallel: int) -> dict[str, Any] | None:
    """Where a launch of `parallel` GPUs goes when the first ones the engine would take are busy:
    the freest, as the CUDA_VISIBLE_DEVICES to launch with (the placement `plan` and `check` use)."""
    from ..host.gpu_pool import pool_from_snapshot

    pool = pool_from_snapshot(snap)
    as_is, freest = pool.placed(parallel, engine_order=True), pool.placed(parallel)
    if as_is is None or freest is None or as_is.indices == freest.indices:
        return None
    busy = [g.index for g in pool.busy if g.index in as_is.indices and g.index not in freest.indices]
    if not busy:
        return None
    cvd = ",".join(map(str, freest.indices))
    return {
        "devices": list(freest.indices),
        "cuda_visible_devices": cvd,
        "text": f"CUDA_VISIBLE_DEVICES={cvd} runs {parallel} GPU{'s' if parallel > 1 else ''} without the busy "
        f"GPU{'s' if len(busy) > 1 else ''} {','.join(map(str, busy))} (the engine takes GPUs "
        f"{','.join(map(str, as_is.indices))} otherwise)",
    }
