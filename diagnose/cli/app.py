"""The typer app every command registers on, and what the commands share: the console, option
checks and the common options.

No `from __future__ import annotations` in cli/: typer reads every command's signature at each
start, and string annotations made it `eval` each of them (~10 ms of every `--help`).
"""

import sys
from enum import StrEnum
from typing import Annotated

from rich.console import Console
from rich.table import Table

from ..outputs.registry import OUTPUTS
from .lean_typer import typer

app = typer.Typer(
    help="Troubleshoot LLM inference servers (vLLM, SGLang, TGI, Ollama, llama.cpp's llama-server, "
    "LMDeploy, TensorRT-LLM, and a generic Python/CUDA server) from their logs. `diagnose --version`.",
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


def make_console() -> Console:
    # on a pipe nothing wraps: one record per line, as grep and awk expect
    wide = None if sys.stdout is not None and sys.stdout.isatty() else 100_000
    return Console(highlight=False, soft_wrap=True, width=wide)


def at_least(hint: str, value: float | None, low: float) -> None:
    """A count or size that must be at least `low` (and a number): a usage error otherwise."""
    import math

    if value is not None and (math.isnan(value) or value < low):
        raise typer.BadParameter(f"{value!r} is not allowed: it must be at least {low:g}", param_hint=hint)


def fraction(hint: str, value: float | None) -> None:
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
BudgetOpt = Annotated[
    list[str] | None,
    typer.Option("--budget", help="Hang budget: PHASE=SECONDS (repeatable) or SECONDS for every phase."),
]


def print_columns(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A table: rich's on a terminal (it folds to the width); on a pipe, plain padded columns,
    one record a line (rich measuring every cell of 150 rows took 0.2 s)."""
    if sys.stdout is not None and sys.stdout.isatty():
        table = Table(box=None, pad_edge=False, show_edge=False)
        for col in headers:
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*row)
        make_console().print(table)
        return
    widths = [max(len(x) for x in col) for col in zip(headers, *rows, strict=True)]
    for row in (headers, *rows):
        cells = [x.ljust(w) for x, w in zip(row[:-1], widths, strict=False)]
        print(" ".join([*cells, row[-1]]).rstrip())
