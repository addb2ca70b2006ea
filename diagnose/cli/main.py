"""The command line's entry: every command group registered, a piped log with no command read as
`scan -`, and click's errors said as one line.
"""

import sys

from ..base.errors import (
    EXIT_OK,
    EXIT_USAGE,
    run_guarded,
    say_error,
)
from .app import Format, app
from .lean_typer import typer

# every command group registers on the app as it is imported, in the order `--help` lists them
from .scan_cmd import scan

# isort: split
from . import fleet_cmd  # noqa: F401

# isort: split
from . import live_cmd  # noqa: F401

# isort: split
from . import probe_cmd  # noqa: F401

# isort: split
from . import kb_cmd  # noqa: F401

# isort: split
from . import plan_cmd  # noqa: F401

# isort: split
from . import rules_cmd  # noqa: F401


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
