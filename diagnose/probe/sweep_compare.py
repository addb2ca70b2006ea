"""A sweep saved as a baseline, and a later sweep judged against it: a change is a regression
only when it is larger than the tolerance, above an absolute floor (a few milliseconds of
loopback jitter are no news), beyond the noise within the run (each step's requests resampled
in both runs: the slowdown must hold in 95 % of the resamples) and beyond the noise between
runs (the step repeated: it must come back in every repeat — a p99 of 16 requests is their
slowest, and one queueing round more or less moves it by half). Without samples (an older
baseline), the point change, the floor and the repeats decide.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from ..base.errors import InputError
from .baseline import read_baseline, write_baseline
from .sweep import Step, Sweep, percentile

RESAMPLES = 400
CONFIDENCE = 0.95
REPEATS = 2  # a step that seems regressed is run again this many times
# below these a change is jitter whatever its percentage (ms)
FLOOR_MS = {"ttft_p50_ms": 5.0, "ttft_p99_ms": 5.0, "tpot_p50_ms": 1.0, "tpot_p99_ms": 1.0}
MEASURES = (  # (key in a step, samples, percentile or None for the mean, worse when higher)
    ("ttft_p50_ms", "ttft_ms", 0.5, True),
    ("ttft_p99_ms", "ttft_ms", 0.99, True),
    ("tpot_p50_ms", "tpot_ms", 0.5, True),
    ("tpot_p99_ms", "tpot_ms", 0.99, True),
    ("tok_per_s", "tok_per_s", None, False),
)


def save_sweep(sweep: Sweep, path: str, url: str, model: str | None) -> None:
    data = {"kind": "sweep", "url": url, "model": model, "saved": time.strftime("%Y-%m-%dT%H:%M:%S")}
    data.update(sweep.to_json(with_samples=True))
    write_baseline(path, data)


def read_sweep_baseline(path: str) -> dict[str, Any]:
    """A saved sweep, checked (before a sweep runs, so a wrong path costs nothing)."""
    base = read_baseline(path)
    if not (isinstance(base, dict) and base.get("kind") == "sweep" and isinstance(base.get("steps"), list)):
        raise InputError(f"{path}: not a sweep baseline (save one with --sweep … --save-baseline)")
    return base


def compare_sweep(
    sweep: Sweep, path: str, tolerance: float, repeat: Callable[[int], Step | None] | None = None
) -> None:
    """Regressions against a saved sweep, step by step at the same concurrency. `repeat(c)`
    runs the step at concurrency c again (None: no repeats): a regression is reported only
    when every repeat shows it too."""
    base = read_sweep_baseline(path)
    old_steps = {s.get("concurrency"): s for s in base["steps"] if isinstance(s, dict)}
    for s in sweep.steps:
        old = old_steps.get(s.concurrency)
        if old is None:
            continue
        found = _regressions(old, s, tolerance)
        for _ in range(REPEATS if found and repeat is not None else 0):
            again = repeat(s.concurrency) if repeat is not None else None
            if again is None:
                break
            still = {k for k, _ in _regressions(old, again, tolerance)}
            found = [(k, text) for k, text in found if k in still]  # noise does not come back
            if not found:
                break
        sweep.regressions += [text for _, text in found]
        if old.get("output") is not None and s.output is not None and old["output"] != s.output:
            sweep.regressions.append(
                f"concurrency {s.concurrency}: the fixed prompt's output changed (temperature 0): "
                "a kernel, dtype or version change alters results"
            )


def _regressions(old: dict[str, Any], s: Step, tolerance: float) -> list[tuple[str, str]]:
    """(measure, what to say) for each measure of the step worse than the baseline's, beyond
    the tolerance, the floor and the noise within the run."""
    out = []
    for key, sample_key, q, worse_if_higher in MEASURES:
        a, b = old.get(key), getattr(s, key)
        if not isinstance(a, (int, float)) or b is None or a <= 0:
            continue
        change = (b - a) / a
        if not ((change > tolerance) if worse_if_higher else (change < -tolerance)):
            continue
        if key in FLOOR_MS and abs(b - a) < FLOOR_MS[key]:
            continue  # jitter, whatever its share
        old_samples = (old.get("samples") or {}).get(sample_key)
        new_samples = s.samples.get(sample_key)
        if old_samples and new_samples and not _beyond_noise(old_samples, new_samples, q, worse_if_higher):
            continue  # within what resampling the same requests gives
        text = f"concurrency {s.concurrency}: {key} {a:g} → {b:g} ({'+' if change >= 0 else ''}{change:.0%})"
        out.append((key, text))
    return out


def _beyond_noise(old: list[float], new: list[float], q: float | None, worse_if_higher: bool) -> bool:
    """Whether the new run is worse than the old in `CONFIDENCE` of the paired resamples."""
    rng = random.Random(1729)  # the same judgement every time for the same runs

    def stat(xs: list[float]) -> float:
        if q is None:
            return sum(xs) / len(xs)
        return percentile(xs, q) or 0.0

    worse = 0
    for _ in range(RESAMPLES):
        a = stat(rng.choices(old, k=len(old)))
        b = stat(rng.choices(new, k=len(new)))
        worse += (b > a) if worse_if_higher else (b < a)
    return worse >= CONFIDENCE * RESAMPLES
