"""`diagnose run` as a supervisor should behave: the first Ctrl-C is answered and escalates by
itself; each phase is printed once; the server's output stays on stdout; `--timeout` stops
watching and leaves the server running (`--stop-at-timeout` stops it); exit codes as a shell
says them; times by the log's own timestamps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .conftest import FIXTURES, ROOT, interruptible

HEALTHY = FIXTURES / "logs" / "vllm" / "healthy-v1-serving.log"

SERVER = """
import signal, sys, time
ignore = "--ignore" in sys.argv
def on_signal(*_):
    if ignore:
        print("ignoring the signal", flush=True)
        return
    print("INFO:     Shutting down", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
for line in open(sys.argv[1]).read().splitlines():
    print(line, flush=True)
    time.sleep(0.005)
n = 0
while True:
    time.sleep(0.2)
    n += 1
    print(f"INFO:     127.0.0.1:40776 - \\"GET /health HTTP/1.1\\" 200 OK {n}", flush=True)
"""


def _server(tmp_path: Path) -> Path:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    return script


def _run_replay(cli: list[str], tmp_path: Path, options: list[str]) -> subprocess.CompletedProcess[bytes]:
    """`diagnose run OPTIONS -- python server.py HEALTHY`: the healthy log replayed, then idle."""
    cmd = [*cli, "run", *options, "--", sys.executable, str(_server(tmp_path)), str(HEALTHY)]
    return subprocess.run(cmd, capture_output=True, timeout=60, cwd=ROOT)


def _wait_for(proc: subprocess.Popen[bytes], path: Path, needle: bytes, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_bytes():
            return
        if proc.poll() is not None:
            raise AssertionError(f"diagnose ended early: {proc.returncode}")
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} never came")


def test_ctrl_c_is_answered_and_escalates_to_sigkill(cli, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    env = {**os.environ, "DIAGNOSE_KILL_GRACE_S": "2"}
    cmd = [
        *cli,
        "run",
        "--log",
        str(log),
        "--",
        sys.executable,
        str(_server(tmp_path)),
        str(HEALTHY),
        "--ignore",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env, preexec_fn=interruptible
    )
    try:
        _wait_for(proc, log, b"GET /health")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = err.decode()
    assert "stopping the server (SIGINT to its process group)… Ctrl-C again to kill it now" in said
    assert "the server did not stop within 2 s of SIGINT: killed (SIGKILL)" in said
    assert "server exit code: 137" in out.decode()  # the shell's 128 + 9, not Python's -9
    assert b"ignoring the signal" in out  # the server's own output, on stdout


def test_phases_once_server_output_on_stdout_times_by_the_log(cli, tmp_path: Path) -> None:
    p = _run_replay(cli, tmp_path, ["--timeout", "3", "--stop-at-timeout"])
    out, err = p.stdout.decode(), p.stderr.decode()
    both = out + err
    assert both.count("] ✓ ready\n") == 1 and both.count("] ✓ args\n") == 1  # each phase printed once
    assert "[   60.0 s log] ✓ ready" in both  # the log's clock: a replay takes a second
    assert "ready in 1 min 00 s by the log's timestamps" in both
    assert "vLLM API server version 0.10.1.1" in out and "vLLM API server version" not in err
    assert p.returncode == 0


def test_timeout_stops_watching_and_leaves_the_server_running(cli, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    p = _run_replay(cli, tmp_path, ["--timeout", "3", "--log", str(log)])
    said = p.stderr.decode()
    assert "stopped watching after 3 s (--timeout): the server keeps running (pid " in said
    pid = int(said.split("(pid ", 1)[1].split(")", 1)[0])
    try:
        assert Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
        before = log.stat().st_size
        time.sleep(1.5)
        assert log.stat().st_size > before  # its output still goes to --log
        assert "server still running" in p.stdout.decode()
    finally:
        os.killpg(pid, signal.SIGKILL)


def test_a_pipe_watched_on_a_terminal_passes_the_output_through_and_says_the_verdict_live(cli) -> None:
    """`vllm serve … 2>&1 | diagnose` on a terminal: the server's lines reach the terminal as
    they come, the failure is said on stderr while the server is still up (it fails, stays up
    six seconds more), and the exit code is the verdict's."""
    import pty
    import select

    master, slave = pty.openpty()
    writer = (
        "import sys, time\n"
        f"for line in open({str(FIXTURES / 'logs' / 'vllm' / 'oom-load-v1-tp2.log')!r}):\n"
        "    sys.stdout.write(line); sys.stdout.flush(); time.sleep(0.002)\n"
        "time.sleep(6)\n"
        "print('still up after the failure', flush=True)\n"
    )
    server = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE)
    proc = subprocess.Popen(cli, stdin=server.stdout, stdout=slave, stderr=subprocess.PIPE, cwd=ROOT)
    os.close(slave)
    assert proc.stderr is not None
    os.set_blocking(proc.stderr.fileno(), False)
    t0, seen, err, said_at = time.monotonic(), b"", b"", None
    try:
        while proc.poll() is None and time.monotonic() - t0 < 40:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(master, 1 << 16)
                except OSError:
                    break
            err += proc.stderr.read() or b""
            if said_at is None and b"the server failed" in err:
                said_at = time.monotonic() - t0
                assert server.poll() is None  # said while the server is up
        err += proc.stderr.read() or b""
    finally:
        os.close(master)
        for p in (proc, server):
            if p.poll() is None:
                p.kill()
    assert said_at is not None and said_at < 5, err.decode()[-500:]
    assert b"failed: CUDA out of memory" in err
    assert b"still up after the failure" in seen and b"Failed to create unquantized linear weights" in seen
    assert proc.wait() == 1
