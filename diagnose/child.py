"""`diagnose run`: start the server as a child, tee its output, diagnose it live.

The child gets its own process group so signals reach the whole server (API process and
workers); Ctrl-C and SIGTERM are forwarded to it, a second Ctrl-C kills it. Output is read
as it comes (select on the pipe), so a last line without a newline and a child that exits
at once are both handled.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Any

from rich.console import Console
from rich.text import Text

from .errors import InputError
from .live import LiveSession, Verdict, make_progress
from .model import Finding

KILL_GRACE_S = float(os.environ.get("DIAGNOSE_KILL_GRACE_S", "10"))


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _end_orphans(proc: subprocess.Popen[bytes]) -> None:
    """The server's process has exited; what is left of its group (workers) is stopped too."""
    _signal_group(proc, signal.SIGTERM)
    time.sleep(0.5)
    _signal_group(proc, signal.SIGKILL)


def terminate(proc: subprocess.Popen[bytes], grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the server's group; SIGKILL what is left after the grace period."""
    if proc.poll() is not None:
        return
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait(timeout=5)


def run_child(
    cmd: list[str],
    session: LiveSession,
    console: Console,
    log_path: str | None,
    stop_on_failure: bool,
    timeout: float | None,
    json_out: bool = False,
    echo: bool = True,
    on_verdict: Any = None,
    grace: float | None = 30.0,
) -> tuple[Verdict, int | None, float]:
    """Run the server as a child in its own process group. Its output is teed to `log_path`
    and (`echo`) to our stderr, and fed to the session; a fatal verdict is handed to
    `on_verdict` as soon as it is known; the server then has `grace` seconds to exit on its own
    before its whole process group is stopped (at once with `stop_on_failure`); the child's own
    exit ends the run even when workers it left behind hold the pipe; Ctrl-C/SIGTERM are
    forwarded to the group; `timeout` ends the whole group."""
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as e:
        raise InputError(f"cannot start {cmd[0]}: {e.strerror or e}") from None
    assert proc.stdout is not None
    logf: Any = None
    if log_path:
        try:
            logf = open(log_path, "ab")  # noqa: SIM115 - closed below
        except OSError as e:
            terminate(proc)
            raise InputError(f"{log_path}: cannot write the log: {e.strerror or e}") from None
    interrupts = 0

    def forward(sig: int, _frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        _signal_group(proc, signal.SIGKILL if interrupts > 1 else sig)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    fd = proc.stdout.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    # the server's own output scrolls on the terminal: phase lines, not a live panel, go with it
    progress = make_progress(session, console, json_out or echo)
    out = sys.stderr.buffer if echo and sys.stderr is not None else None
    partial = b""
    verdict: Verdict | None = None
    announced_ready = False
    fatal_at: float | None = None  # when a fatal verdict was said (the grace period starts)
    try:
        while True:
            eof = False
            ready = sel.select(timeout=0.5)
            if not ready and proc.poll() is not None:
                # the child itself has exited and its output is drained: workers it left behind
                # may hold the pipe open for ever, so its exit, not the pipe's end, ends the run
                _end_orphans(proc)
                eof = True
            if ready:
                data = os.read(fd, 1 << 16)
                if not data:
                    eof = True
                else:
                    if logf is not None:
                        logf.write(data)
                        logf.flush()
                    if out is not None:
                        out.write(data)
                        out.flush()
                    buf = partial + data
                    cut = buf.rfind(b"\n")
                    if cut >= 0:
                        session.feed(buf[: cut + 1])
                        partial = buf[cut + 1 :]
                    else:
                        partial = buf
            if eof:
                break
            if verdict is None:
                v = session.check()
                if v is not None and v.kind == "ready":
                    if not announced_ready:
                        announced_ready = True
                        progress.stop()
                        # with --json, stdout carries the JSON alone: progress goes to stderr
                        (Console(stderr=True) if json_out else console).print(
                            Text(
                                f"ready in {time.monotonic() - started:.0f} s; watching for runtime failures",
                                style="bold green",
                            )
                        )
                        progress = make_progress(session, console, json_out)
                    session.follow_after_ready = True
                elif v is not None:
                    verdict = v
                    fatal_at = time.monotonic()
                    if stop_on_failure:
                        progress.stop()
                        terminate(proc)
                    elif on_verdict is not None:
                        on_verdict(v)  # said now; the server may exit on its own within `grace`
                progress.update()
            if fatal_at is not None and grace is not None and time.monotonic() - fatal_at > grace:
                if proc.poll() is None:
                    progress.stop()
                    terminate(proc)  # the whole group: a failed server that would not exit
                break
            if timeout is not None and verdict is None and time.monotonic() - started > timeout:
                # a server that became ready and ran until --timeout is not a failure: a stop
                verdict = Verdict("stopped" if announced_ready else "timeout", session.diagnosis())
                progress.stop()
                terminate(proc)  # the whole group: nothing is left running with its pipe closed
                break
        if partial:
            session.feed(partial + b"\n")  # a last line the server never finished
        rc = proc.poll()
        if rc is None and eof:
            rc = proc.wait()
        if verdict is None:
            verdict = session.check(final=True) or _ended(session, rc, stopped=interrupts > 0)
    finally:
        progress.stop()
        sel.close()
        for s, h in old.items():
            signal.signal(s, h)
        if logf is not None:
            logf.close()
    return verdict, proc.poll(), started


STOP_EXIT = {130: "Ctrl-C", 143: "SIGTERM", -2: "SIGINT", -15: "SIGTERM"}


def _ended(session: LiveSession, rc: int | None, stopped: bool = False) -> Verdict:
    """The server exited with no finding. Stopped on purpose (Ctrl-C forwarded by us, or a
    SIGINT/SIGTERM exit from a scheduler) it is a stop: an info finding, the status it had.
    Any other non-zero exit is still a failure."""
    if rc in (0, None):
        return Verdict("ended", session.diagnosis(final=True))
    how = f"killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
    stop = stopped or rc in STOP_EXIT
    why = STOP_EXIT.get(rc, "a signal forwarded by diagnose")
    f = Finding(
        rule="run.stop" if stop else "run.exit",
        cls="stop" if stop else "unknown_error",
        severity="info" if stop else "fatal",
        title=f"The server was stopped ({why}; it {how})" if stop else f"The server {how}",
        line=session.lines,
        source=session.source,
        evidence=session.last_line or "(no output)",
        facts={"exit_code": rc},
    )
    return Verdict("ended" if stop else "fatal", session.diagnosis(extra=[f], final=True))
