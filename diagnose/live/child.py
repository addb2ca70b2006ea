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

from ..base.errors import InputError
from ..model.records import Finding
from .session import LiveSession, PlainProgress, Verdict, make_progress

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
    stop_at_timeout: bool = False,
) -> tuple[Verdict, int | None, float]:
    """Run the server as a child in its own process group. Its output is teed to `log_path`
    and (`echo`) to our stderr, and fed to the session; a fatal verdict is handed to
    `on_verdict` as soon as it is known; the server then has `grace` seconds to exit on its own
    before its whole process group is stopped (at once with `stop_on_failure`); the child's own
    exit ends the run even when workers it left behind hold the pipe; Ctrl-C/SIGTERM are
    forwarded to the group; `timeout` ends the whole group."""
    run = _ChildRun(cmd, session, console, log_path, json_out, echo)
    old = {s: signal.signal(s, run.forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not run.read():
            if run.verdict is None:
                run.judge(stop_on_failure, on_verdict)
            if run.fatal_at is not None and grace is not None and time.monotonic() - run.fatal_at > grace:
                run.stop()  # the whole group: a failed server that would not exit
                break
            if timeout is not None and run.verdict is None and time.monotonic() - run.started > timeout:
                # watching ends; a server that became ready and ran until then is not a failure
                run.verdict = Verdict("stopped" if run.announced_ready else "timeout", session.diagnosis())
                if stop_at_timeout:
                    run.stop(always=True)  # the whole group
                else:
                    run.hand_off(timeout)  # it keeps running; its output drained elsewhere
                break
        verdict = run.finish()
    finally:
        run.close()
        for s, h in old.items():
            signal.signal(s, h)
    return verdict, shell_code(run.proc.poll()), run.started


class _ChildRun:
    """One server child: its pipe read, teed and fed to the session, its verdict as it comes."""

    def __init__(
        self,
        cmd: list[str],
        session: LiveSession,
        console: Console,
        log_path: str | None,
        json_out: bool,
        echo: bool,
    ):
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            raise InputError(f"cannot start {cmd[0]}: {e.strerror or e}") from None
        assert self.proc.stdout is not None
        self.logf: Any = None
        if log_path:
            try:
                self.logf = open(log_path, "ab")  # noqa: SIM115 - closed in close()
            except OSError as e:
                terminate(self.proc)
                raise InputError(f"{log_path}: cannot write the log: {e.strerror or e}") from None
        self.session, self.console, self.json_out = session, console, json_out
        self.interrupts = 0
        self.stop_to_mark = ""  # a signal forwarded that the session has not been told of yet
        self.stopping_at: float | None = None  # when the first Ctrl-C/SIGTERM was forwarded
        self.stop_signal = ""
        self.killed = False
        self.handed_off = False  # --timeout left it running, its output drained by a copier
        self.to_say: list[str] = []  # what a signal handler wants said (the loop says it)
        self.started = time.monotonic()
        self.fd = self.proc.stdout.fileno()
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.fd, selectors.EVENT_READ)
        # the server's own output scrolls on the terminal: phase lines, not a live panel, go with it
        self.progress = make_progress(session, console, json_out or echo)
        # the server's output stays on stdout (with --json, stdout carries the JSON alone: stderr)
        stream = sys.stderr if json_out else sys.stdout
        self.out = stream.buffer if echo and stream is not None else None
        self.partial = b""
        self.verdict: Verdict | None = None
        self.announced_ready = False
        self.fatal_at: float | None = None  # when a fatal verdict was said (the grace period starts)
        self.eof = False

    def forward(self, sig: int, _frame: Any) -> None:
        """Ctrl-C/SIGTERM: forwarded to the whole group (a timed SIGKILL follows); a second one
        kills it now. What is said of it is said by the loop, not in the handler."""
        self.interrupts += 1
        if self.interrupts == 1:  # the signal as it came: Ctrl-C is SIGINT, a scheduler's stop SIGTERM
            self.stop_to_mark = self.stop_signal = signal.Signals(sig).name
            self.stopping_at = time.monotonic()
            _signal_group(self.proc, sig)
        else:
            self.to_say.append("killing the server now (SIGKILL to its process group)")
            _signal_group(self.proc, signal.SIGKILL)

    def escalate(self) -> None:
        """What a stop asked for, said; a server that outlives its SIGTERM grace is killed."""
        for line in self.to_say:
            self._say(line)
        self.to_say.clear()
        if (
            self.stopping_at is not None
            and not self.killed
            and self.proc.poll() is None
            and time.monotonic() - self.stopping_at > KILL_GRACE_S
        ):
            self.killed = True
            self._say(
                f"the server did not stop within {KILL_GRACE_S:.0f} s of {self.stop_signal}: killed (SIGKILL)"
            )
            _signal_group(self.proc, signal.SIGKILL)

    def _say(self, text: str) -> None:
        if sys.stderr is not None:
            print(f"diagnose: {text}", file=sys.stderr, flush=True)

    def read(self) -> bool:
        """Wait up to half a second for output and take it; whether the run's output ended."""
        ready = self.sel.select(timeout=0.5)  # a forwarded signal interrupts it (its handler runs)
        if self.stop_to_mark:
            # before any output the server printed after the signal
            self.session.stop_requested(f"{self.stop_to_mark} forwarded to the server by diagnose run")
            self.progress.stop()  # no panel counting on while the server stops
            self._say(
                f"stopping the server ({self.stop_to_mark} to its process group)… Ctrl-C again to kill "
                f"it now; it is killed in {KILL_GRACE_S:.0f} s otherwise"
            )
            self.stop_to_mark = ""
        self.escalate()
        if not ready and self.proc.poll() is not None:
            # the child itself has exited and its output is drained: workers it left behind
            # may hold the pipe open for ever, so its exit, not the pipe's end, ends the run
            _end_orphans(self.proc)
            self.eof = True
        elif ready:
            data = os.read(self.fd, 1 << 16)
            if not data:
                self.eof = True
            else:
                self._take(data)
        return self.eof

    def _take(self, data: bytes) -> None:
        for sink in (self.logf, self.out):
            if sink is not None:
                sink.write(data)
                sink.flush()
        buf = self.partial + data
        cut = buf.rfind(b"\n")
        if cut >= 0:
            self.session.feed(buf[: cut + 1])
            self.partial = buf[cut + 1 :]
        else:
            self.partial = buf

    def judge(self, stop_on_failure: bool, on_verdict: Any) -> None:
        v = self.session.check()
        if v is not None and v.kind == "ready":
            if not self.announced_ready:
                self.announced_ready = True
                if not isinstance(self.progress, PlainProgress):
                    self.progress.stop()
                else:
                    self.progress.update()
                # with --json, stdout carries the JSON alone: progress goes to stderr
                (Console(stderr=True) if self.json_out else self.console).print(
                    Text(
                        f"{self.session.ready_said()}; watching for runtime failures",
                        style="bold green",
                    )
                )
                if not isinstance(self.progress, PlainProgress):  # plain lines go on as they were
                    self.progress = make_progress(self.session, self.console, self.json_out)
            self.session.follow_after_ready = True
        elif v is not None:
            self.verdict = v
            self.fatal_at = time.monotonic()
            if stop_on_failure:
                self.progress.stop()
                terminate(self.proc)
            elif on_verdict is not None:
                on_verdict(v, self.proc.poll() is None)  # said now; it may exit on its own within `grace`
        self.progress.update()

    def hand_off(self, after: float) -> None:
        """Stop watching, not the server: its output pipe goes to a detached copier (into --log,
        or nowhere), so the server neither blocks on a full pipe nor dies writing to a closed one."""
        import shutil

        self.progress.stop()
        copier = [shutil.which("cat") or sys.executable]
        if copier[0] == sys.executable:
            copier += ["-c", "import shutil, sys; shutil.copyfileobj(sys.stdin.buffer, sys.stdout.buffer)"]
        sink = self.logf if self.logf is not None else subprocess.DEVNULL
        if self.logf is not None:
            self.logf.flush()
        subprocess.Popen(
            copier, stdin=self.fd, stdout=sink, stderr=subprocess.DEVNULL, start_new_session=True
        )
        where = (
            f"its output goes on to {self.logf.name}" if self.logf is not None else "its output is discarded"
        )
        self._say(
            f"stopped watching after {after:g} s (--timeout): the server keeps running (pid {self.proc.pid}); "
            f"{where}; --stop-at-timeout stops it instead"
        )
        self.handed_off = True

    def stop(self, always: bool = False) -> None:
        """Stop the whole process group (`always`: even when the child itself has exited)."""
        if always or self.proc.poll() is None:
            self.progress.stop()
            terminate(self.proc)

    def finish(self) -> Verdict:
        if self.partial:
            self.session.feed(self.partial + b"\n")  # a last line the server never finished
        rc = self.proc.poll()
        if rc is None and self.eof and not self.handed_off:
            rc = self.proc.wait()
        if self.verdict is None:
            self.verdict = self.session.check(final=True) or _ended(
                self.session, rc, stopped=self.interrupts > 0
            )
        return self.verdict

    def close(self) -> None:
        self.progress.stop()
        self.sel.close()
        if self.logf is not None:
            self.logf.close()


STOP_EXIT = {130: "Ctrl-C", 143: "SIGTERM"}


def shell_code(rc: int | None) -> int | None:
    """An exit status as a shell says it: a death by signal N is 128 + N (Python says -N)."""
    return 128 - rc if rc is not None and rc < 0 else rc


def _ended(session: LiveSession, rc: int | None, stopped: bool = False) -> Verdict:
    """The server exited with no finding. Stopped on purpose (Ctrl-C forwarded by us, or a
    SIGINT/SIGTERM exit from a scheduler) it is a stop: an info finding, the status it had.
    Any other non-zero exit is still a failure."""
    if rc in (0, None):
        return Verdict("ended", session.diagnosis(final=True))
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
        how = f"killed by {name} (exit code {128 - rc})"
    else:
        how = f"exited with code {rc}"
    rc = shell_code(rc)
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
