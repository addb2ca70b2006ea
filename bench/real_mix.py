#!/usr/bin/env python3
"""The real logs of ../shared/real-logs as a benchmark, beside the generated one.

1. The real-log mix: every case's log concatenated (in name order) and repeated to SIZE MB;
   `diagnose scan --json MIX` against `rg -c -F -f needles` and `grep -c -F -f needles` in the
   same run (the rules' own needles); MB/s, the ratio to rg (to grep when rg is absent), and
   peak RSS against the mix's first MB.
2. Many small logs in one call: N copies of the real logs (cycling through the cases) in one
   directory, `diagnose scan --json DIR/*` once: milliseconds per log.

Skips with a one-line reason when ../shared/real-logs is absent.
Usage: bench/real_mix.py [--size-mb 100] [--files 1000] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import DIAGNOSE, ROOT, peak_rss_mb, timed

REAL = ROOT.parent / "shared" / "real-logs"


def real_logs() -> list[Path]:
    return sorted(REAL.glob("*/log.txt"))


def build_mix(out: Path, size_mb: float) -> None:
    logs = [p.read_bytes() for p in real_logs()]
    once = b"".join(x if x.endswith(b"\n") else x + b"\n" for x in logs)
    with open(out, "wb") as f:
        written = 0
        while written < size_mb * 1e6:
            f.write(once)
            written += len(once)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=100)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    if not real_logs():
        print(f"skipped: no real logs at {REAL}")
        return
    work = Path(tempfile.mkdtemp(prefix="diagnose-mix-"))
    import diagnose
    from diagnose.knowledge.rules import load_rules

    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(Path(diagnose.__file__).parent)],
        stdout=subprocess.DEVNULL,
        check=False,
    )
    env = {**os.environ, "DIAGNOSE_CACHE": str(work / "cache"), "DIAGNOSE_KB": str(work / "kb")}
    os.environ.update(env)
    mix = work / "mix.log"
    build_mix(mix, a.size_mb)
    size = mix.stat().st_size / 1e6
    nfile = work / "needles.txt"
    nfile.write_text("\n".join(sorted({n for r in load_rules().rules for n in r.needles})) + "\n")
    subprocess.run(
        [DIAGNOSE, "scan", "--json", str(real_logs()[0])], capture_output=True, check=False
    )  # fill the cache
    rows = [("diagnose scan --json", [DIAGNOSE, "scan", "--json", str(mix)])]
    if shutil.which("rg"):
        rows.append(("rg -c -F -f needles", ["rg", "-c", "-F", "-f", str(nfile), str(mix)]))
    rows.append(("grep -c -F -f needles", ["grep", "-c", "-F", "-f", str(nfile), str(mix)]))
    times = {name: timed(cmd, a.runs) for name, cmd in rows}
    ref_name = "rg -c -F -f needles" if "rg -c -F -f needles" in times else "grep -c -F -f needles"
    ref = times[ref_name]
    print(f"real-log mix: {len(real_logs())} logs repeated to {size:.0f} MB; best of {a.runs}")
    print(f"{'':28s} {'s':>7s} {'MB/s':>8s} {'speed vs ' + ref_name.split()[0]:>14s}")
    for name, t in times.items():
        print(f"{name:28s} {t:7.2f} {size / t:8.1f} {ref / t:13.1%}")
    first_mb = work / "mix-1mb.log"
    with open(mix, "rb") as f:
        first_mb.write_bytes(f.read(1_000_000))
    rss_big = peak_rss_mb([DIAGNOSE, "scan", "--json", str(mix)])
    rss_small = peak_rss_mb([DIAGNOSE, "scan", "--json", str(first_mb)])
    print(
        f"peak RSS: {rss_big:.0f} MB for {size:.0f} MB, {rss_small:.0f} MB for 1 MB ({rss_big / rss_small:.2f}x)"
    )

    many = work / "many"
    many.mkdir()
    logs = real_logs()
    for i in range(a.files):
        shutil.copyfile(logs[i % len(logs)], many / f"{i:05d}.log")
    files = sorted(str(p) for p in many.iterdir())
    t = timed([DIAGNOSE, "scan", "--json", *files], a.runs)
    print(f"{a.files} small real logs in one call: {t:.2f} s, {t / a.files * 1000:.1f} ms per log")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
