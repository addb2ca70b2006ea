"""A probe's result saved as a baseline and compared with a later one."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..base.atomic import atomic_write
from ..base.errors import InputError
from .result import ProbeResult, rounded


def save_baseline(res: ProbeResult, path: str) -> None:
    data = {
        "url": res.url,
        "model": res.model,
        "ttft_ms": rounded(res.ttft_ms),
        "total_ms": rounded(res.total_ms),
        "tokens_per_s": rounded(res.tokens_per_s),
        "saved": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    write_baseline(path, data)


def write_baseline(path: str, data: dict[str, Any]) -> None:
    """A baseline file, written atomically (a probe's or a sweep's)."""
    try:
        atomic_write(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    except OSError as e:
        raise InputError(f"{path}: cannot write the baseline: {e.strerror or e}") from None


def read_baseline(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read the baseline: {e}") from None


def compare_baseline(res: ProbeResult, path: str, tolerance: float) -> None:
    base = read_baseline(path)
    if not isinstance(base, dict):
        raise InputError(f"{path}: not a baseline file (expected a JSON object)")
    for key, worse_if_higher in (("ttft_ms", True), ("total_ms", True), ("tokens_per_s", False)):
        old, new = base.get(key), getattr(res, key)
        if not isinstance(old, (int, float)) or new is None or old <= 0:
            continue
        change = (new - old) / old
        regressed = change > tolerance if worse_if_higher else change < -tolerance
        res.check(
            f"baseline {key}",
            not regressed,
            round(new, 1),
            f"{'+' if change >= 0 else ''}{change:.0%} against {old} (tolerance {tolerance:.0%})",
        )
    if not res.ok and res.cause is None:
        res.fail(
            "service",
            "slower than the baseline",
            "compare what changed (engine version, flags, load on the GPU); diagnose scan the server log",
        )
