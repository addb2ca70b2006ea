#!/usr/bin/env python3
"""Throughput, cold start and memory of `diagnose scan`, against ripgrep and grep in the same run.

1. Throughput: `diagnose scan --json BIG` vs `rg -c -F -f needles.txt BIG` and
   `grep -c -F -f needles.txt BIG`, with the needles the rules declare. MB/s and ratios.
2. Cold start: `diagnose scan` of a 1 MB crash log vs `python -c pass`, as a user meets it:
   bytecode compiled (pip does it at install; done here with compileall, since an editable
   install under PYTHONDONTWRITEBYTECODE would otherwise recompile every module each run),
   first run after install (rule cache empty) and every run after (cache filled).
3. Memory: peak RSS scanning BIG vs scanning 1 MB of it.

Usage: bench/throughput.py [--size-mb 1024] [--log PATH] [--runs 3]
(the log is generated with bench/gen_log.py when missing)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DIAGNOSE = str(BIN / "diagnose")


def timed(cmd: list[str], runs: int) -> float:
    # output to a pipe, not /dev/null: GNU grep stops at the first match when it sees /dev/null
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=False)
        best = min(best, time.perf_counter() - t)
    return best


def median_time(cmd: list[str], runs: int, env: dict[str, str] | None = None) -> float:
    xs = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=env)
        xs.append(time.perf_counter() - t)
    return statistics.median(xs)


def peak_rss_mb(cmd: list[str]) -> float:
    """Peak RSS of one child: measured by a fresh wrapper so earlier children do not count."""
    code = (
        "import resource, subprocess, sys; subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--log", default=None)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="diagnose-bench-"))
    big = Path(a.log) if a.log else work / "big.log"
    if not big.exists():
        subprocess.run(
            [sys.executable, str(ROOT / "bench" / "gen_log.py"), str(big), str(a.size_mb)], check=True
        )
    size_mb = big.stat().st_size / 1e6
    sys.path.insert(0, str(ROOT))
    from diagnose.knowledge.rules import load_rules

    needles = sorted({n for r in load_rules().rules for n in r.needles})
    nfile = work / "needles.txt"
    nfile.write_text("\n".join(needles) + "\n")
    small = work / "crash-1mb.log"
    with open(big, "rb") as f:
        small.write_bytes(
            f.read(1_000_000)
            + (ROOT / "fixtures/logs/vllm/oom-runtime-v1-fragmented.log").read_bytes()[-40000:]
        )
    subprocess.run(["cat", str(big)], stdout=subprocess.DEVNULL, check=False)  # warm the page cache

    print(f"machine: {os.cpu_count()} CPUs; log {size_mb:.0f} MB; {len(needles)} needles")
    rows = [("diagnose scan --json", [DIAGNOSE, "scan", "--json", str(big)])]
    if shutil.which("rg"):
        rows.append(("rg -c -F -f needles", ["rg", "-c", "-F", "-f", str(nfile), str(big)]))
    rows.append(("grep -c -F -f needles", ["grep", "-c", "-F", "-f", str(nfile), str(big)]))
    times = {name: timed(cmd, a.runs) for name, cmd in rows}
    ref = times.get("rg -c -F -f needles")
    print(f"{'throughput':28s} {'s':>7s} {'MB/s':>8s} {'vs rg':>7s}")
    for name, t in times.items():
        ratio = f"{ref / t:6.0%}" if ref else "   n/a"
        print(f"{name:28s} {t:7.2f} {size_mb / t:8.0f} {ratio:>7s}")
    import diagnose

    pkg = Path(diagnose.__file__).parent
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(pkg)], stdout=subprocess.DEVNULL, check=False
    )
    cache = work / "cache"
    env = {**os.environ, "DIAGNOSE_CACHE": str(cache), "DIAGNOSE_KB": str(work / "kb")}
    first = []
    for _ in range(5):  # the first run after install: no validated-rules cache yet
        shutil.rmtree(cache, ignore_errors=True)
        first.append(median_time([DIAGNOSE, "scan", str(small)], 1, env))
    base = median_time([sys.executable, "-c", "pass"], 21)
    cold = median_time([DIAGNOSE, "scan", str(small)], 21, env)
    print(
        f"cold start: diagnose scan 1 MB crash log {cold * 1000:.0f} ms, python -c pass {base * 1000:.1f} ms "
        f"({cold / base:.1f}x); first run after install {statistics.median(first) * 1000:.0f} ms "
        f"({statistics.median(first) / base:.1f}x)"
    )
    rss_big = peak_rss_mb([DIAGNOSE, "scan", "--json", str(big)])
    rss_small = peak_rss_mb([DIAGNOSE, "scan", "--json", str(small)])
    print(
        f"peak RSS: {rss_big:.0f} MB for {size_mb:.0f} MB, {rss_small:.0f} MB for 1 MB ({rss_big / rss_small:.2f}x)"
    )


if __name__ == "__main__":
    main()
