"""watch and run against real processes and files: no sleeps-and-hope, counts checked exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from diagnose.live.follow import Follower

from .conftest import FIXTURES, ROOT, interruptible

LOGS = FIXTURES / "logs"

WRITER = r"""
import sys, time
src, dst, pause, stop_after = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
with open(src, "rb") as f:
    lines = f.readlines()
with open(dst, "ab", buffering=0) as out:
    for i, line in enumerate(lines):
        if stop_after and i >= stop_after:
            time.sleep(600)  # a stalled server: alive, silent
        out.write(line)
        time.sleep(pause)
"""


def writer(src, dst, pause=0.002, stop_after=0):
    return subprocess.Popen([sys.executable, "-c", WRITER, str(src), str(dst), str(pause), str(stop_after)])


def collect_until(follower: Follower, got: list[bytes], want: int, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while sum(b.count(b"\n") for b in got) < want and time.monotonic() < deadline:
        follower.check()
        follower.wait(0.2)


def test_watch_a_log_being_written_stops_on_the_fatal_line(cli, tmp_path):
    log = tmp_path / "serve.log"  # does not exist yet: watch waits for it
    w = writer(LOGS / "vllm" / "kv-cache-too-small-v1.log", log)
    try:
        p = subprocess.run(
            [*cli, "watch", str(log), "--json", "--timeout", "60"], capture_output=True, timeout=90, cwd=ROOT
        )
    finally:
        w.kill()
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["status"] == "failed"
    assert doc["primary"]["class"] == "kv_cache_too_small" and doc["advice"][0]["to"] == "72704"


def test_watch_healthy_start_exits_0_on_ready(cli, tmp_path):
    log = tmp_path / "serve.log"
    w = writer(LOGS / "sglang" / "healthy-tp2-serving.log", log)
    try:
        p = subprocess.run(
            [*cli, "watch", str(log), "--timeout", "60"], capture_output=True, timeout=90, cwd=ROOT
        )
    finally:
        w.kill()
    out = p.stdout.decode()
    assert p.returncode == 0 and "ready in" in out and "✓ ready" in out
    assert "✓ loading weights" in out  # plain timestamped phase lines on a pipe


def test_stalled_phase_is_a_hang(cli, tmp_path):
    log = tmp_path / "serve.log"
    w = writer(
        LOGS / "vllm" / "healthy-v0-tp2-serving.log", log, stop_after=13
    )  # stops inside distributed init
    try:
        p = subprocess.run(
            [*cli, "watch", str(log), "--json", "--budget", "distributed_init=1.5", "--timeout", "60"],
            capture_output=True,
            timeout=90,
            cwd=ROOT,
        )
    finally:
        w.kill()
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["primary"]["class"] == "hang"
    assert doc["primary"]["facts"]["phase"] == "distributed_init"
    assert doc["advice"][0]["param"] == "env:NCCL_DEBUG"


def test_timeout_gives_up_incomplete(cli, tmp_path):
    log = tmp_path / "serve.log"
    log.write_text("INFO 05-26 18:53:37 [api_server.py:1043] vLLM API server version 0.8.5.post1\n")
    p = subprocess.run(
        [*cli, "watch", str(log), "--json", "--timeout", "1"], capture_output=True, timeout=60, cwd=ROOT
    )
    assert p.returncode == 1 and json.loads(p.stdout)["status"] == "incomplete"


def test_partial_line_is_held_until_its_newline(tmp_path):
    path = tmp_path / "p.log"
    path.write_bytes(b"")
    got: list[bytes] = []
    f = Follower(str(path), got.append)
    f.start()
    try:
        with open(path, "ab", buffering=0) as out:
            out.write(b"first half ")
            f.check()
            assert got == []
            out.write(b"second half\nnext")
            f.check()
            assert got == [b"first half second half\n"]
    finally:
        f.stop()


@pytest.mark.parametrize("poll", [False, True])
def test_rotation_and_truncation_lose_and_repeat_nothing(tmp_path, poll):
    path = tmp_path / "r.log"
    got: list[bytes] = []
    f = Follower(str(path), got.append, poll=poll, poll_interval=0.05)
    f.start()  # before the file exists
    n = 0

    def write(k: int) -> None:
        nonlocal n
        with open(path, "ab") as out:
            out.write(b"".join(b"line %d\n" % (n + i) for i in range(k)))
        n += k

    try:
        write(1000)
        collect_until(f, got, 1000)
        os.rename(path, tmp_path / "r.log.1")  # logrotate: rename, then a new file
        write(1000)
        collect_until(f, got, 2000)
        with open(path, "r+b") as t:  # copytruncate
            t.truncate(0)
        f.check()
        write(500)
        collect_until(f, got, 2500)
    finally:
        f.stop()
    lines = b"".join(got).splitlines()
    assert lines == [b"line %d" % i for i in range(2500)]
    assert f.rotations == 1 and f.truncations == 1


@pytest.mark.parametrize("trial", range(20))
def test_two_hundred_thousand_lines_in_bursts(tmp_path, trial):
    path = tmp_path / "b.log"
    path.write_bytes(b"")
    got: list[bytes] = []
    f = Follower(str(path), got.append)
    f.start()
    total = 200_000

    def burst_writer() -> None:
        with open(path, "ab") as out:
            for start in range(0, total, 10_000):
                out.write(b"".join(b"%d\n" % i for i in range(start, start + 10_000)))
                out.flush()
                time.sleep(0.01)

    t = threading.Thread(target=burst_writer)
    t.start()
    try:
        collect_until(f, got, total, limit=60)
    finally:
        t.join()
        f.stop()
    numbers = [int(x) for x in b"".join(got).split()]
    assert numbers == list(range(total))


def test_run_reports_a_crash_and_the_child_exit_code(cli, tmp_path):
    script = tmp_path / "server.sh"
    script.write_text(
        f"#!/bin/sh\ncat {LOGS / 'vllm' / 'oom-startup-v1-cuda-graphs.log'}\n"
        "printf 'a last line without newline'\nexit 1\n"
    )
    script.chmod(0o755)
    log = tmp_path / "run.log"
    p = subprocess.run(
        [*cli, "run", "--log", str(log), "--", str(script)], capture_output=True, timeout=60, cwd=ROOT
    )
    out = p.stdout.decode()
    assert (
        p.returncode == 1 and "✗ failed: CUDA runtime out of memory" in out and "server exit code: 1" in out
    )
    assert log.read_bytes().endswith(b"a last line without newline")


def test_run_a_server_that_exits_at_once(cli):
    p = subprocess.run(
        [*cli, "run", "--json", "--", sys.executable, "-c", "raise SystemExit(3)"],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    doc = json.loads(p.stdout)
    assert (
        p.returncode == 1
        and doc["primary"]["rule"] == "run.exit"
        and doc["primary"]["facts"]["exit_code"] == 3
    )


def _ready_server(tmp_path, seconds_up: int):
    """A server script that becomes ready (vLLM's own lines) and stays up for a while."""
    script = tmp_path / "server.sh"
    script.write_text(
        "#!/bin/sh\n"
        "echo 'INFO 03-01 10:00:00 [api_server.py:1] vLLM API server version 0.10.2'\n"
        "echo 'INFO:     Application startup complete.'\n"
        "echo 'INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)'\n"
        f"sleep {seconds_up}\n"
    )
    script.chmod(0o755)
    return script


def test_run_json_after_ready_is_pure_json_on_stdout(cli, tmp_path):
    # the "ready in N s" progress line went to stdout before the JSON document
    script = _ready_server(tmp_path, 1)
    p = subprocess.run(
        [*cli, "run", "--json", "--quiet", "--", str(script)], capture_output=True, timeout=60, cwd=ROOT
    )
    doc = json.loads(p.stdout)  # nothing but the document
    assert doc["status"] == "ready"
    assert b"ready in" in p.stderr


def test_run_timeout_after_ready_is_a_stop_not_a_failure(cli, tmp_path):
    script = _ready_server(tmp_path, 30)
    p = subprocess.run(
        [*cli, "run", "--quiet", "--timeout", "2", "--", str(script)],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stdout.decode()[-500:]
    assert "stopped watching at --timeout" in p.stdout.decode()


def test_run_stops_a_failed_server_after_the_grace_period(cli, tmp_path):
    # a fatal line while the server keeps running: the verdict at once, the group stopped
    # after --grace, exit 1 (it waited for ever before)
    script = tmp_path / "server.sh"
    script.write_text(f"#!/bin/sh\ncat {LOGS / 'vllm' / 'kv-cache-too-small-v1.log'}\nsleep 60\n")
    script.chmod(0o755)
    t = time.monotonic()
    p = subprocess.run(
        [*cli, "run", "--quiet", "--grace", "1", "--", str(script)], capture_output=True, timeout=60, cwd=ROOT
    )
    assert p.returncode == 1 and "✗ failed" in p.stdout.decode()
    assert time.monotonic() - t < 15


def test_run_ends_with_the_child_even_when_its_workers_hold_the_pipe(cli, tmp_path):
    # the server's parent process dies; a worker it left behind keeps stdout open
    script = tmp_path / "server.sh"
    script.write_text(
        "#!/bin/sh\necho 'INFO 03-01 10:00:00 [api_server.py:1] vLLM API server version 0.10.2'\n"
        "(sleep 60; echo late) &\nexit 3\n"
    )
    script.chmod(0o755)
    t = time.monotonic()
    p = subprocess.run(
        [*cli, "run", "--json", "--quiet", "--", str(script)], capture_output=True, timeout=60, cwd=ROOT
    )
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["primary"]["facts"]["exit_code"] == 3
    assert time.monotonic() - t < 15


def test_run_stop_on_failure_kills_a_server_that_ignores_sigterm(cli, tmp_path):
    script = tmp_path / "stubborn.sh"
    pidfile = tmp_path / "pid"
    script.write_text(
        f"#!/bin/sh\necho $$ > {pidfile}\ntrap '' TERM\n"
        f"cat {LOGS / 'vllm' / 'gpu-busy-v1.log'}\nwhile true; do sleep 0.2; done\n"
    )
    script.chmod(0o755)
    env = {**os.environ, "DIAGNOSE_KILL_GRACE_S": "1"}
    t0 = time.monotonic()
    p = subprocess.run(
        [*cli, "run", "--stop-on-failure", "--json", "--", str(script)],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert time.monotonic() - t0 < 30
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["primary"]["class"] == "gpu_busy"
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_run_ctrl_c_of_a_ready_server_is_a_stop(cli, tmp_path):
    """Ctrl-C on a healthy, ready server: diagnose forwards it, the server exits on SIGINT, and
    the verdict is 'ready, then stopped' with exit code 0, not a failure."""
    script = tmp_path / "server.sh"
    script.write_text(
        f"#!/bin/sh\ncat {LOGS / 'vllm' / 'healthy-v1-serving.log'}\n"
        "trap 'echo KeyboardInterrupt; exit 130' INT\nwhile true; do sleep 0.1; done\n"
    )
    script.chmod(0o755)
    proc = subprocess.Popen(
        [*cli, "run", "--", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        preexec_fn=interruptible,
    )
    try:
        time.sleep(3)  # ready by then: the whole healthy log is out
        proc.send_signal(signal.SIGINT)
        out, _err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.decode()
    assert proc.returncode == 0, text
    assert "stopped" in text and "failed" not in text


@pytest.mark.parametrize("target", ["dir", "binary"])
def test_watch_refuses_a_directory_or_a_binary_at_once(cli, tmp_path, target):
    path = tmp_path if target == "dir" else tmp_path / "blob"
    if target == "binary":
        path.write_bytes(b"\x7fELF\x00\x00\x01")
    t0 = time.monotonic()
    p = subprocess.run([*cli, "watch", str(path)], capture_output=True, timeout=30, cwd=ROOT)
    assert p.returncode == 2 and time.monotonic() - t0 < 10
    assert b"directory" in p.stderr or b"binary" in p.stderr


def test_run_tees_the_output_and_says_the_verdict_while_the_server_is_up(cli, tmp_path):
    script = tmp_path / "server.sh"
    script.write_text(
        f"#!/bin/sh\necho 'hello from the server'\ncat {LOGS / 'vllm' / 'oom-load-v1-tp2.log'}\nsleep 60\n"
    )
    script.chmod(0o755)
    proc = subprocess.Popen(
        [*cli, "run", "--", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        preexec_fn=interruptible,
    )
    try:
        seen = b""
        t0 = time.monotonic()
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        while b"failed: CUDA out of memory" not in seen and time.monotonic() - t0 < 20:
            time.sleep(0.1)
            seen += proc.stdout.read() or b""
        assert b"failed: CUDA out of memory" in seen and proc.poll() is None  # said while the server is up
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert b"hello from the server" in seen + (rest or b"")  # the server's own output, on stdout
    assert b"stopping the server (SIGINT to its process group)" in err  # the Ctrl-C answered
    assert proc.returncode == 1


def test_run_timeout_leaves_no_process_behind(cli, tmp_path):
    script = tmp_path / "slow.sh"
    pidfile = tmp_path / "pid"
    script.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nsleep 120 &\necho $! >> {pidfile}\nwait\n")
    script.chmod(0o755)
    t0 = time.monotonic()
    p = subprocess.run(
        [*cli, "run", "--timeout", "2", "--stop-at-timeout", "--", str(script)],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert time.monotonic() - t0 < 30 and b"stopped watching (--timeout)" in p.stdout
    for pid in map(int, pidfile.read_text().split()):
        status = Path(f"/proc/{pid}/status")
        # gone, or dead and waiting for init to reap it (a zombie runs nothing)
        assert not status.exists() or "State:\tZ" in status.read_text()


def test_twenty_trials_of_rename_copytruncate_rewrite_and_burst_lose_nothing(tmp_path):
    """Each trial: lines, a logrotate rename, a copytruncate whose new content is written past
    the old size before the follower looks, then a burst. Every line arrives once, in order."""
    for trial in range(20):
        path = tmp_path / f"t{trial}.log"
        got: list[bytes] = []
        f = Follower(str(path), got.append, poll_interval=0.05)
        f.start()
        n = 0

        def write(k: int, tag: bytes, p=path) -> None:  # type: ignore[no-untyped-def]
            nonlocal n
            with open(p, "ab") as out:
                out.write(b"".join(b"%s %d\n" % (tag, n + i) for i in range(k)))
            n += k

        try:
            write(300, b"a")
            collect_until(f, got, n)
            os.rename(path, tmp_path / f"t{trial}.log.1")
            write(300, b"b")
            collect_until(f, got, n)
            with open(path, "r+b") as t:  # copytruncate ...
                t.truncate(0)
            write(1200, b"c")  # ... and more than the old size written before anyone looks
            collect_until(f, got, n)
            write(20_000, b"d")  # a burst
            collect_until(f, got, n)
        finally:
            f.stop()
        lines = b"".join(got).splitlines()
        assert [int(x.split()[1]) for x in lines] == list(range(n)), f"trial {trial}"
        assert f.rotations == 1 and f.truncations == 1, f"trial {trial}"


def test_ctrl_c_during_watch_prints_the_log_so_far(cli, tmp_path):
    log = tmp_path / "serve.log"
    log.write_bytes(
        b"\n".join((LOGS / "vllm" / "healthy-v0-tp2-serving.log").read_bytes().split(b"\n")[:12]) + b"\n"
    )
    proc = subprocess.Popen(
        [*cli, "watch", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        preexec_fn=interruptible,
    )
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert b"stopped watching (Ctrl-C)" in out and b"incomplete" in out and b"Traceback" not in err


def test_ctrl_c_while_the_modules_load_is_one_line_not_a_traceback(monkeypatch, capsys):
    # a Ctrl-C in the first ~50 ms lands in an import, before any command's own handler
    import diagnose.entry as entry

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(entry, "_route", interrupted)
    with pytest.raises(SystemExit) as e:
        entry.main()
    assert e.value.code == 130
    assert capsys.readouterr().err == "diagnose: interrupted\n"


NUMBERED_WRITER = r"""
import signal, sys, time
path, n = sys.argv[1], int(sys.argv[2])
reopen = []
signal.signal(signal.SIGHUP, lambda *a: reopen.append(1))  # logrotate's postrotate: reopen the log
out = open(path, "ab", buffering=0)
for i in range(n):
    if reopen:
        out.close()
        out = open(path, "ab", buffering=0)
        reopen.clear()
    out.write(b"line %06d\n" % i)
    if i % 50 == 0:
        time.sleep(0.002)
out.close()
"""


def _rotate(mode: str, path: Path, w: subprocess.Popen[bytes]) -> None:
    old = path.with_name(path.name + ".1")
    if mode == "copytruncate":  # logrotate copytruncate: copy, then cut the file the writer keeps
        old.write_bytes(path.read_bytes())
        with open(path, "r+b") as f:
            f.truncate(0)
    elif mode == "rename-then-reopen-later":  # create + a postrotate HUP that lands a while later
        os.rename(path, old)
        time.sleep(0.05)
        path.touch()
        time.sleep(0.05)
        w.send_signal(signal.SIGHUP)
    elif mode == "rename-and-reopen":
        os.rename(path, old)
        path.touch()
        w.send_signal(signal.SIGHUP)
    else:  # delete and recreate: the writer writes the unlinked file until it reopens
        path.unlink()
        path.touch()
        w.send_signal(signal.SIGHUP)


@pytest.mark.parametrize("mode", ["copytruncate", "rename-then-reopen-later", "rename-and-reopen", "delete"])
def test_twenty_trials_of_rotation_while_a_writer_process_writes_lose_nothing(tmp_path, mode):
    """A separate process writes 5,000 numbered lines while the file is rotated under it; the
    follower hands on every line the writer wrote exactly once, in order: from the renamed or
    unlinked file until the writer reopens, from the rotated copy for what a copytruncate took
    away before it was read (a line written between the copy and the cut is in no file: the
    rotation lost it, and it is not counted)."""
    n = 5000
    for trial in range(20):
        path = tmp_path / f"w{trial}.log"
        path.touch()
        got: list[bytes] = []
        f = Follower(str(path), got.append, poll_interval=0.05)
        f.start()
        done = threading.Event()

        def follow(fol: Follower = f, done: threading.Event = done) -> None:
            while not done.is_set():
                fol.check()
                fol.wait(0.05)

        t = threading.Thread(target=follow)
        t.start()
        w = subprocess.Popen([sys.executable, "-c", NUMBERED_WRITER, str(path), str(n)])
        try:
            deadline = time.monotonic() + 10
            while path.stat().st_size == 0 and time.monotonic() < deadline:
                time.sleep(0.01)  # the writer is up (its SIGHUP handler set before its first line)
            time.sleep(0.05)
            _rotate(mode, path, w)
            assert w.wait(timeout=30) == 0
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # until the last line written has come
                if got and got[-1].endswith(b"line %06d\n" % (n - 1)):
                    break
                time.sleep(0.02)
        finally:
            done.set()
            t.join()
            f.check()
            f.stop()
        numbers = [int(x.split()[1]) for x in b"".join(got).splitlines()]
        lost_by_rotation = set()
        if mode == "copytruncate":  # written after the copy, cut before anyone could read it
            on_disk = {
                int(x.split()[1])
                for p in (path, path.with_name(path.name + ".1"))
                for x in p.read_bytes().splitlines()
            }
            lost_by_rotation = set(range(n)) - on_disk - set(numbers)
        assert numbers == sorted(set(numbers)), f"trial {trial}: a line repeated or out of order"
        missing = set(range(n)) - set(numbers) - lost_by_rotation
        assert not missing, f"trial {trial}: {len(missing)} lines lost, first {min(missing)}"


TWO_PROCESS_SERVER = r"""
import os, signal, subprocess, sys, time
if sys.argv[1] == "core":  # the engine core: on Ctrl-C its worker dies first, loudly
    def die(*a):
        print("(EngineCore pid=237) ERROR 06-06 19:51:19 [multiproc_executor.py:283] Worker proc "
              "VllmWorker-0 died unexpectedly, shutting down executor.", flush=True)
        print("Traceback (most recent call last):", flush=True)
        print('  File "/x/vllm/v1/engine/core.py", line 3, in run_engine_core', flush=True)
        print("RuntimeError: Engine core initialization failed. See root cause above.", flush=True)
        os._exit(1)
    signal.signal(signal.SIGINT, die)
    print("core up", flush=True)
    while True:
        time.sleep(0.05)
sys.stdout.write(open(sys.argv[2]).read()); sys.stdout.flush()
core = subprocess.Popen([sys.executable, __file__ if False else sys.argv[3], "core"])
def stop(*a):  # the API server notices later, and says nothing of a signal
    time.sleep(0.5)
    print("(APIServer pid=2) INFO 06-06 19:51:20 [launcher.py:80] Shutting down FastAPI HTTP server.", flush=True)
    core.wait()
    sys.exit(0)
signal.signal(signal.SIGINT, stop)
while True:
    time.sleep(0.1)
"""


def test_run_ctrl_c_of_a_two_process_server_is_a_stop_whichever_speaks_first(cli, tmp_path):
    """vLLM's API server and engine core both get the Ctrl-C; here the engine core dies first,
    with a worker-died error and a traceback, before the API server says anything. diagnose
    forwarded the Ctrl-C itself, so what follows it is the stop, not a failure."""
    script = tmp_path / "server.py"
    script.write_text(TWO_PROCESS_SERVER)
    log = LOGS / "vllm" / "healthy-v1-serving.log"
    teed = tmp_path / "server.log"
    proc = subprocess.Popen(
        [
            *cli,
            "run",
            "--json",
            "--log",
            str(teed),
            "--",
            sys.executable,
            str(script),
            "api",
            str(log),
            str(script),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        preexec_fn=interruptible,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (teed.exists() and b"core up" in teed.read_bytes()):
            time.sleep(0.1)  # the whole healthy log is out and the engine core is up
        time.sleep(1)  # read and judged ready
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    doc = json.loads(out)
    assert b"died unexpectedly" in err  # the engine core did speak first (teed to stderr)
    assert proc.returncode == 0, (doc["status"], doc.get("primary"))
    assert doc["status"] != "failed"
    assert any(f["class"] == "stop" for f in doc["findings"])


def test_run_termination_log_holds_the_one_line_verdict(cli, tmp_path):
    """What the kubelet shows in the pod status: one line, the class, the evidence, the change."""
    script = tmp_path / "server.sh"
    script.write_text(f"#!/bin/sh\ncat {LOGS / 'vllm' / 'kv-cache-too-small-v1.log'}\nexit 1\n")
    script.chmod(0o755)
    term = tmp_path / "termination-log"
    p = subprocess.run(
        [*cli, "run", "--quiet", "--termination-log", str(term), "--", str(script)],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert p.returncode == 1
    text = term.read_text(encoding="utf-8")
    assert text.endswith("\n") and text.count("\n") == 1 and len(text.encode()) <= 4096
    assert text.startswith("diagnose: failed")
    assert "kv_cache_too_small" in text and "next: --max-model-len 72704 (was 131072)" in text


def test_run_termination_log_of_a_server_stopped_after_ready(cli, tmp_path):
    script = _ready_server(tmp_path, 30)
    term = tmp_path / "termination-log"
    p = subprocess.run(
        [*cli, "run", "--quiet", "--timeout", "2", "--termination-log", str(term), "--", str(script)],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert p.returncode == 0 and term.read_text(encoding="utf-8").startswith("diagnose: ready")


def test_run_refuses_an_unwritable_termination_log_before_starting(cli, tmp_path):
    marker = tmp_path / "started"
    p = subprocess.run(
        [*cli, "run", "--termination-log", "/proc/no/such/dir/log", "--", "touch", str(marker)],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert p.returncode == 2 and b"termination log" in p.stderr and not marker.exists()


def test_a_termination_message_is_cut_to_the_kubelets_limit_on_a_character(know):
    from diagnose.fleet.termination import LIMIT, fit, message

    long = "é" * 5000
    assert len(fit(long).encode()) <= LIMIT and fit(long).endswith("…")
    from diagnose.pipeline.scan import scan_paths

    d = scan_paths([str(LOGS / "vllm" / "kv-cache-too-small-v1.log")], know)
    d.primary.evidence = "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456789AB " + "x" * 10_000
    msg = message(d, "fatal")
    assert len((msg + "\n").encode()) <= LIMIT and "\n" not in msg and "hf_abcdefghij" not in msg
