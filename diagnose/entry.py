"""Process entry: routes argv and turns every failure into one line and an exit code.

A plain `scan` runs straight from `scan_command` (no CLI framework imported: it is what
pipes and health checks call, and it has to start fast); every other command goes through
the typer app in `cli.main`.
"""

from __future__ import annotations

import sys

from .base.errors import run_guarded

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import NoReturn


def main() -> NoReturn:
    from .base.redact import RedactingWriter

    out, err = sys.stdout, sys.stderr
    # every line the process prints is redacted on its way out (redact.RedactingWriter)
    sys.stdout, sys.stderr = RedactingWriter(out), RedactingWriter(err)  # type: ignore[assignment]
    try:
        _route()
    except KeyboardInterrupt:  # Ctrl-C while the modules still load: no traceback either
        print("diagnose: interrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        for wrapped in (sys.stdout, sys.stderr):
            try:  # noqa: SIM105 - contextlib is not imported on the scan path (start-up time)
                wrapped.flush()
            except (OSError, ValueError):
                pass  # a closed pipe: nothing more to say
        sys.stdout, sys.stderr = out, err
    sys.exit(0)


DISTRIBUTION = "diagnose-llm"  # the name it is installed by (PyPI's `diagnose` is another project)


def version_line() -> str:
    from . import __version__

    return f"{DISTRIBUTION} {__version__} (python {sys.version.split()[0]})"


def _route() -> None:
    argv = sys.argv[1:]
    if argv in (["--version"], ["-V"]):
        print(version_line())
        return
    if argv in (["--version", "--json"], ["--json", "--version"]):
        import json

        from . import __version__

        print(json.dumps({"name": DISTRIBUTION, "version": __version__, "python": sys.version.split()[0]}))
        return
    if argv[:1] == ["scan"] or (argv[:1] and argv[0].startswith("--")):
        # `… | diagnose --json` is `diagnose scan --json -`: no command means scan
        from .cli.fast_scan import SCAN_OPTIONS, read_scan_argv, run_scan

        rest = argv[1:] if argv[0] == "scan" else argv
        if argv[0] == "scan" or argv[0].partition("=")[0] in SCAN_OPTIONS:
            kw = read_scan_argv(rest)
            if kw is not None:
                run_guarded(lambda: run_scan(**kw))
    from .cli.main import main as full_cli

    full_cli()
