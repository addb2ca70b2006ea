#!/usr/bin/env python3
"""Live latency and idle CPU of `diagnose watch`, against `tail -F | grep --line-buffered`.

Latency: from the write of a fatal line to the verdict on watch's stdout (p50, p95), with
watch already following the file; the same for tail -F | grep on the same file, in the same
run. Idle CPU: watch following a silent file for --idle seconds.

Usage: bench/live_latency.py [--trials 200] [--idle 60]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREFIX = (
    (ROOT / "fixtures" / "logs" / "vllm" / "healthy-v0-tp2-serving.log").read_text().splitlines(True)[:13]
)
FATAL = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.02 GiB is free.\n"
)
DIAGNOSE = str(Path(sys.executable).parent / "diagnose")


def read_until(proc: subprocess.Popen[bytes], needle: bytes, timeout: float = 30) -> float:
    """Seconds (monotonic clock) when a line holding needle arrived on proc's stdout."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf += chunk
            if needle in buf:
                return time.monotonic()
    raise TimeoutError(f"no {needle!r} within {timeout} s")


def trial(cmd: list[str], ready: bytes | None, verdict: bytes, shell: bool = False) -> float:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "serve.log"
        path.write_text("".join(PREFIX))
        full = cmd[0].format(path=path) if shell else None
        proc = subprocess.Popen(
            full if shell else [*cmd, str(path)],
            shell=shell,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            if ready is not None:
                read_until(proc, ready)
            else:
                time.sleep(0.3)  # tail | grep print nothing until the match
            with open(path, "a") as f:
                t0 = time.monotonic()
                f.write(FATAL)
                f.flush()
            t1 = read_until(proc, verdict)
            return t1 - t0
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()


def idle_cpu(seconds: float) -> float:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "serve.log"
        path.write_text("".join(PREFIX))
        proc = subprocess.Popen(
            [DIAGNOSE, "watch", str(path), "--budget", "100000"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        read_until(proc, b"distributed init")
        tick = os.sysconf("SC_CLK_TCK")

        def cpu() -> float:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick

        c0, t0 = cpu(), time.monotonic()
        time.sleep(seconds)
        c1, t1 = cpu(), time.monotonic()
        proc.kill()
        proc.wait()
        return 100 * (c1 - c0) / (t1 - t0)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--idle", type=float, default=60)
    a = ap.parse_args()
    ours = [trial([DIAGNOSE, "watch"], b"distributed init", b"failed") for _ in range(a.trials)]
    if shutil.which("tail") and shutil.which("grep"):
        ref = [
            trial(
                ["tail -n +1 -F {path} | grep --line-buffered 'CUDA out of memory'"],
                None,
                b"CUDA out of memory",
                shell=True,
            )
            for _ in range(a.trials)
        ]
    else:
        ref = []
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print(f"{'':32s} {'p50 ms':>8s} {'p95 ms':>8s}")
    print(f"{'diagnose watch':32s} {1000 * statistics.median(ours):8.1f} {1000 * pct(ours, 0.95):8.1f}")
    if ref:
        print(
            f"{'tail -F | grep --line-buffered':32s} {1000 * statistics.median(ref):8.1f} {1000 * pct(ref, 0.95):8.1f}"
        )
    if a.idle > 0:
        print(f"idle CPU of diagnose watch over {a.idle:.0f} s of silence: {idle_cpu(a.idle):.2f} %")


if __name__ == "__main__":
    main()
