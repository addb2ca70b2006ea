"""Errors the user can act on: printed as one line, never as a traceback."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import NoReturn

# Exit codes, in one place.
EXIT_OK = 0  # ready / healthy / nothing wrong found
EXIT_FOUND = 1  # a failure (or degradation) was found
EXIT_USAGE = 2  # usage or input error


class InputError(Exception):
    """Bad input (file, stdin, rule, config). Exit code 2."""

    exit_code = 2


class RuleError(InputError):
    """A rule or profile file is malformed: names the file, the rule id and the field."""

    def __init__(self, path: str, rule_id: str | None, field: str | None, problem: str):
        self.path = path
        self.rule_id = rule_id
        self.field = field
        self.problem = problem
        where = path
        if rule_id:
            where += f": rule {rule_id}"
        if field:
            where += f": field '{field}'"
        super().__init__(f"{where}: {problem}")


def say_error(msg: str) -> None:
    print(f"diagnose: error: {msg}", file=sys.stderr)


def say_warning(msg: str) -> None:
    print(f"diagnose: warning: {msg}", file=sys.stderr)


def run_guarded(command: Callable[[], int]) -> NoReturn:
    """Run, exit with its code; user errors are one line and exit 2, never a traceback."""
    try:
        rc = command()
    except InputError as e:
        say_error(str(e))
        rc = EXIT_USAGE
    except KeyboardInterrupt:
        print("diagnose: interrupted", file=sys.stderr)
        rc = 130
    except BrokenPipeError:
        # the reader went away (| head): not an error worth a traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        rc = 0
    except Exception as e:
        if os.environ.get("DIAGNOSE_DEBUG"):
            raise
        say_error(f"internal error: {type(e).__name__}: {e} (set DIAGNOSE_DEBUG=1 for the traceback)")
        rc = EXIT_USAGE
    sys.exit(rc)


def yaml_problem(e: Exception) -> str:
    """A YAML error in one line: what is wrong and on which line (PyYAML's own message spans
    several, with the file name and a caret)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None)
    if not problem:
        text = str(e)
        problem = text.splitlines()[0] if text else type(e).__name__
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{' '.join(str(problem).split())}{where}"
