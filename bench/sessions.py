#!/usr/bin/env python3
"""Many sources in one process: the streaming library API and `diagnose stream`.

Two workloads: `serving` (a fleet in steady state: each source a vLLM server's startup, then
its request and stats lines, from bench/gen_log.py) and `startup` (the fixture logs' first
lines, nearly every one a candidate line: the worst case).

1. N sessions (default 1,000) interleaved in one process through `diagnose.stream.Sessions`,
   one line at a time in round-robin: total lines per second (timed without tracemalloc), then
   memory per open session (tracemalloc, a second run: what the sessions hold once every line
   is fed, before they close).
2. `diagnose stream` on the same lines as Vector records over N sources: records per second
   (whole process, start-up included), beside `jq -c .` on the same records when present.

Usage: bench/sessions.py [--sessions 1000] [--lines 1000] [--workload serving|startup]
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from diagnose.knowledge.loaded import Knowledge  # noqa: E402
from diagnose.stream.session import Sessions  # noqa: E402


def workload(n_sources: int, per_source: int, kind: str = "startup") -> list[tuple[str, str]]:
    if kind == "serving":
        with tempfile.TemporaryDirectory() as d:
            log = Path(d) / "serving.log"
            subprocess.run([sys.executable, str(ROOT / "bench" / "gen_log.py"), str(log), "8"], check=True)
            lines = log.read_text(encoding="utf-8").splitlines()
        head = next(i for i, x in enumerate(lines) if "POST /v1/" in x)  # the startup, then serving
        texts = [lines[:head] + lines[head + 997 * i : head + 997 * i + per_source] for i in range(16)]
    else:
        logs = sorted((ROOT / "fixtures" / "logs").glob("*/*.log"))
        texts = [p.read_text(encoding="utf-8").splitlines() for p in logs]
    feeds = []
    for i in range(n_sources):
        lines = texts[i % len(texts)]
        feeds.append([lines[j % len(lines)] for j in range(per_source)] if lines else [])
    out = []
    for j in range(per_source):  # round-robin: every source advances one line at a time
        for i in range(n_sources):
            if j < len(feeds[i]):
                out.append((f"ns/pod-{i}/engine", feeds[i][j]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--lines", type=int, default=1000, help="lines per source")
    ap.add_argument("--workload", choices=("serving", "startup"), default="serving")
    a = ap.parse_args()
    know = Knowledge.load(None)
    lines = workload(a.sessions, a.lines, a.workload)
    # the harness's million (source, line) pairs are not the library's: out of the collector's
    # sight (gc.freeze), as lines read from a pipe would be, so its passes time the sessions only
    gc.collect()
    gc.freeze()

    sessions = Sessions(know, max_sessions=a.sessions)
    t = time.perf_counter()
    for source, line in lines:
        sessions.feed_line(source, line)
    for s in sessions.sessions():
        s.flush()
    fed = time.perf_counter() - t
    t = time.perf_counter()
    sessions.close_all()
    closing = time.perf_counter() - t
    print(f"{a.workload}: {a.sessions} sessions interleaved, {len(lines):,} lines")
    print(f"  fed in {fed:.2f} s: {len(lines) / fed:,.0f} lines/s; closing all: {closing:.2f} s")

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    sessions = Sessions(know, max_sessions=a.sessions)
    for source, line in lines:
        sessions.feed_line(source, line)
    for s in sessions.sessions():
        s.flush()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    sessions.close_all()
    print(f"  held while open: {held / a.sessions / 1024:.0f} KiB per session (tracemalloc)")

    work = Path(tempfile.mkdtemp(prefix="diagnose-sessions-"))
    records = work / "records.jsonl"
    with open(records, "w", encoding="utf-8") as f:
        for source, line in lines:
            ns, pod, container = source.split("/")
            rec = {
                "message": line,
                "kubernetes": {"pod_namespace": ns, "pod_name": pod, "container_name": container},
            }
            f.write(json.dumps(rec) + "\n")
    exe = str(Path(sys.executable).parent / "diagnose")
    t = time.perf_counter()
    subprocess.run(
        [exe, "stream", "--events", "closed", str(records)], stdout=subprocess.DEVNULL, check=False
    )
    whole = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=False)
    empty = time.perf_counter() - t
    print(
        f"diagnose stream, {len(lines):,} Vector records over {a.sessions} sources: {whole:.2f} s, "
        f"{len(lines) / whole:,.0f} records/s (python -c pass: {empty * 1000:.0f} ms)"
    )
    if shutil.which("jq"):
        t = time.perf_counter()
        subprocess.run(["jq", "-c", ".", str(records)], stdout=subprocess.DEVNULL, check=False)
        print(f"  jq -c . on the same records: {time.perf_counter() - t:.2f} s")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
