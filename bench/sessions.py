#!/usr/bin/env python3
"""Many sources in one process: the streaming library API and `diagnose stream`.

1. N sessions (default 1,000) interleaved in one process through `diagnose.stream.Sessions`,
   each fed a log of the fixtures (cycling through them), one line at a time in round-robin:
   total lines per second, and memory per open session (tracemalloc: what the sessions hold
   once every line is fed, before they close), against feeding the same lines to one session.
2. `diagnose stream` on the same lines as Vector records over N sources: records per second
   (whole process, start-up included), against `python -c pass`... and `jq -c .` when present.

Usage: bench/sessions.py [--sessions 1000] [--lines 200]
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
from diagnose.knowledge import Knowledge  # noqa: E402
from diagnose.stream import Sessions  # noqa: E402


def workload(n_sources: int, per_source: int) -> list[tuple[str, str]]:
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
    ap.add_argument("--lines", type=int, default=200, help="lines per source")
    a = ap.parse_args()
    know = Knowledge.load(None)
    lines = workload(a.sessions, a.lines)

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    sessions = Sessions(know, max_sessions=a.sessions)
    t = time.perf_counter()
    for source, line in lines:
        sessions.feed_line(source, line)
    for s in sessions.sessions():
        s.flush()
    fed = time.perf_counter() - t
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    t = time.perf_counter()
    sessions.close_all()
    closing = time.perf_counter() - t
    print(f"{a.sessions} sessions interleaved, {len(lines):,} lines")
    print(f"  fed in {fed:.2f} s: {len(lines) / fed:,.0f} lines/s; closing all: {closing:.2f} s")
    print(f"  held while open: {held / a.sessions / 1024:.0f} KiB per session (tracemalloc)")

    one = Sessions(know)
    t = time.perf_counter()
    for _source, line in lines:
        one.feed_line("one", line)
    one.close_all()
    print(f"  the same lines through one session: {len(lines) / (time.perf_counter() - t):,.0f} lines/s")

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
