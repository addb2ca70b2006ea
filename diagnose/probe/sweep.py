"""`probe --sweep`: the concurrency knee of a live server (guide 001 §5.2).

At each concurrency, N streamed requests of one fixed prompt (temperature 0) from that many
workers; per request the time to the first token (TTFT), the time per output token after it
(TPOT) and the tokens; per step p50/p99, requests and tokens per second, errors. While a step
runs, the server's `/metrics` (Prometheus text, vLLM and SGLang names) is sampled for the
queue, the running batch, KV usage and preemptions. The knee is the last concurrency whose
next step still bought throughput: beyond it throughput stops growing while p99 latency
climbs. What bounds it comes from the metrics (KV full → `kv`; a queue behind a batch pinned
at the same size with KV to spare → `scheduler`; the batch growing but each token slower →
`compute`), else `unknown`. Bounded in requests and time; Ctrl-C keeps what was measured.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from ..base.errors import InputError
from .completion import Streamed, _payload, read_stream
from .result import Timeouts

GROWTH = 1.10  # a step that adds less than 10 % throughput did not pay
LATENCY_CLIMB = 1.25  # …while p99 latency rose by a quarter: past the knee
METRICS_EVERY_S = 0.1  # /metrics is a cheap read; a step may last under a second
KV_FULL = 0.9
KV_SPARE = 0.8
SAMPLES_KEPT = 512  # per step and measure, in a baseline


@dataclass
class Step:
    concurrency: int
    requests: int = 0
    errors: int = 0
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    req_per_s: float | None = None
    tok_per_s: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # maxima while the step ran
    output: str | None = None  # the fixed prompt's text (temperature 0), for --compare
    # each request's TTFT and TPOT (ms) and tokens/s: a saved baseline keeps them, so --compare
    # can tell a real change from the run-to-run noise (probe/sweep_compare.py)
    samples: dict[str, list[float]] = field(default_factory=dict)

    def to_json(self, with_samples: bool = False) -> dict[str, Any]:
        out = asdict(self)
        if not self.metrics:
            out.pop("metrics")
        if not with_samples:
            out.pop("samples")
        return out


@dataclass
class Sweep:
    steps: list[Step] = field(default_factory=list)
    knee: int | None = None
    bound: str = "unknown"  # kv / scheduler / compute / unknown
    why: str = ""
    next_step: str | None = None
    stopped: str | None = None  # why the sweep ended early (time, requests, Ctrl-C)
    regressions: list[str] = field(default_factory=list)

    def to_json(self, with_samples: bool = False) -> dict[str, Any]:
        return {
            "steps": [s.to_json(with_samples) for s in self.steps],
            "knee": self.knee,
            "bound": self.bound,
            "why": self.why,
            "next_step": self.next_step,
            "stopped": self.stopped,
            "regressions": self.regressions,
        }


def percentile(vals: list[float], q: float) -> float | None:
    """Nearest-rank percentile (p99 of 16 requests is the slowest, as a user meets it)."""
    if not vals:
        return None
    s = sorted(vals)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 1)) - 1))
    return s[k]


def read_metrics(text: str, vocabularies: list[dict[str, Any]]) -> dict[str, float]:
    """The engine gauges the profiles name (`metrics:` in rules/engines/*.yaml), read from
    Prometheus text with prometheus_client's parser: a gauge summed over its labels (per-engine
    series of one server), KV usage the fullest one; {} when the text is not Prometheus's."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append(float(s.value))
    except (ValueError, TypeError, IndexError):
        return {}
    out: dict[str, float] = {}
    for vocabulary in vocabularies:
        for key, names in vocabulary.items():
            if isinstance(names, dict):  # a ratio of two gauges (TGI: batch tokens over the budget)
                num, den = (sum(samples.get(n, [])) for n in names["ratio"])
                if den and names["ratio"][0] in samples:
                    out[key] = num / den
                continue
            values = [v for n in names for v in samples.get(n, [])]
            if values and key == "kv_usage":
                out[key] = max(out.get(key, 0.0), *values)
            elif values:
                out[key] = out.get(key, 0.0) + sum(values)
    return out


class MetricsSampler:
    """Polls /metrics in a thread while a step runs; keeps each gauge's maximum."""

    def __init__(self, client: httpx.Client, url: str, vocabularies: list[dict[str, Any]]) -> None:
        self.client, self.url, self.vocabularies = client, url, vocabularies
        self.available = True
        self.maxima: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _poll(self) -> None:
        try:
            r = self.client.get(self.url + "/metrics", timeout=2.0)
        except httpx.HTTPError:
            self.available = False
            return
        if r.status_code != 200:
            self.available = False
            return
        for k, v in read_metrics(r.text, self.vocabularies).items():
            self.first.setdefault(k, v)
            self.maxima[k] = max(v, self.maxima.get(k, v))

    def __enter__(self) -> MetricsSampler:
        self.maxima, self.first = {}, {}
        self._stop.clear()
        if self.available:

            def loop() -> None:
                while self.available and not self._stop.is_set():
                    self._poll()
                    self._stop.wait(METRICS_EVERY_S)

            self._thread = threading.Thread(target=loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=3)
        if self.available:
            self._poll()

    def step_metrics(self) -> dict[str, float]:
        out = dict(self.maxima)
        if "preemptions" in out:  # a counter: what this step added
            out["preemptions"] = out["preemptions"] - self.first.get("preemptions", out["preemptions"])
        return {k: round(v, 4) for k, v in out.items()}


def _one_request(
    client: httpx.Client, url: str, model: str | None, prompt: str, max_tokens: int, chat: bool
) -> tuple[float, float | None, int, str] | None:
    """(ttft_s, tpot_s, tokens, text) of one streamed request, None on an error."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    payload = _payload(model, prompt, max_tokens, chat, True)
    payload["temperature"] = 0
    start = time.monotonic()
    got = Streamed()
    try:
        with client.stream("POST", url + path, json=payload) as r:
            if r.status_code != 200:
                r.read()
                return None
            read_stream(r, chat, got)
    except httpx.HTTPError:
        return None
    end = time.monotonic()
    if not got.done or not got.pieces:
        return None
    first = got.pieces[0][0]
    tokens = int((got.usage or {}).get("completion_tokens") or len(got.pieces))
    tpot = (end - first) / (tokens - 1) if tokens > 1 else None
    return first - start, tpot, tokens, "".join(text for _, text in got.pieces)


def run_sweep(
    url: str,
    model: str | None,
    levels: list[int],
    prompt: str,
    max_tokens: int,
    chat: bool = False,
    per_level: int | None = None,
    max_requests: int = 2000,
    time_budget_s: float = 600.0,
    timeouts: Timeouts | None = None,
    headers: dict[str, str] | None = None,
    progress: Any = None,
    metrics: list[dict[str, Any]] | None = None,
) -> Sweep:
    """Every level in turn; `progress(done, total, step)` after each request when given.
    `metrics`: the engines' /metrics vocabularies (the shipped profiles' when None)."""
    if metrics is None:
        from ..knowledge.engine_profiles import load_profiles

        metrics = load_profiles().metrics
    t = timeouts or Timeouts()
    url = url.rstrip("/")
    sweep = Sweep()
    plan = [(c, per_level or max(8, 2 * c)) for c in levels]
    total = sum(n for _, n in plan)
    if total > max_requests:
        raise InputError(
            f"the sweep would send {total} requests, over --max-requests {max_requests}: fewer levels or --per-level"
        )
    deadline = time.monotonic() + time_budget_s
    limits = httpx.Limits(max_connections=max(levels) + 2, max_keepalive_connections=max(levels) + 2)
    timeout = httpx.Timeout(connect=t.connect, read=t.first_byte, write=t.connect, pool=t.first_byte)
    done = 0
    with httpx.Client(timeout=timeout, trust_env=False, headers=headers or {}, limits=limits) as client:
        sampler = MetricsSampler(client, url, metrics)
        try:
            for c, n in plan:
                if time.monotonic() > deadline:
                    sweep.stopped = f"the time budget ({time_budget_s:.0f} s) ran out before concurrency {c}"
                    break
                step = Step(concurrency=c)
                results: list[tuple[float, float | None, int, str] | None] = []
                lock = threading.Lock()

                def work(_: int, results: list[Any] = results, lock: Any = lock, c: int = c) -> None:
                    nonlocal done
                    r = _one_request(client, url, model, prompt, max_tokens, chat)
                    with lock:
                        results.append(r)
                        done += 1
                        if progress is not None:
                            progress(done, total, c)

                t0 = time.monotonic()
                with sampler, ThreadPoolExecutor(max_workers=c) as pool:
                    list(pool.map(work, range(n)))
                elapsed = time.monotonic() - t0
                _summarise(step, results, elapsed)
                step.metrics = sampler.step_metrics() if sampler.available else {}
                sweep.steps.append(step)
        except KeyboardInterrupt:
            sweep.stopped = "stopped with Ctrl-C"
    judge_sweep(sweep)
    return sweep


def _summarise(
    step: Step, results: list[tuple[float, float | None, int, str] | None], elapsed: float
) -> None:
    good = [r for r in results if r is not None]
    step.requests = len(results)
    step.errors = len(results) - len(good)
    ttft = [1000 * r[0] for r in good]
    tpot = [1000 * r[1] for r in good if r[1] is not None]
    step.ttft_p50_ms, step.ttft_p99_ms = _ms(percentile(ttft, 0.5)), _ms(percentile(ttft, 0.99))
    step.tpot_p50_ms, step.tpot_p99_ms = _ms(percentile(tpot, 0.5)), _ms(percentile(tpot, 0.99))
    if elapsed > 0:
        step.req_per_s = round(len(good) / elapsed, 2)
        step.tok_per_s = round(sum(r[2] for r in good) / elapsed, 1)
    step.output = good[0][3] if good else None
    rates = [r[2] / (r[0] + r[1] * max(0, r[2] - 1)) for r in good if r[1] is not None and r[2] > 1]
    step.samples = {
        "ttft_ms": [round(x, 2) for x in ttft[:SAMPLES_KEPT]],
        "tpot_ms": [round(x, 3) for x in tpot[:SAMPLES_KEPT]],
        "tok_per_s": [round(x, 2) for x in rates[:SAMPLES_KEPT]],
    }


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _latency(s: Step) -> float:
    """p99 of the whole answer as a user waits for it: TTFT plus the decode of the rest."""
    return (s.ttft_p99_ms or 0.0) + (s.tpot_p99_ms or 0.0)


def judge_sweep(sweep: Sweep) -> None:
    steps = [s for s in sweep.steps if s.tok_per_s]
    if len(steps) < 2:
        sweep.why = "fewer than two steps measured: no knee to tell"
        return
    knee_i = len(steps) - 1
    for i in range(1, len(steps)):
        prev, cur = steps[i - 1], steps[i]
        if cur.tok_per_s < GROWTH * prev.tok_per_s and _latency(cur) >= LATENCY_CLIMB * _latency(prev):  # type: ignore[operator]
            knee_i = i - 1
            break
    else:
        sweep.knee = steps[-1].concurrency
        sweep.why = (
            f"throughput still grew up to concurrency {steps[-1].concurrency} "
            f"({steps[-1].tok_per_s:g} tokens/s): the knee is higher; sweep further"
        )
        sweep.bound = _bound(steps[-1], steps)
        sweep.next_step = NEXT.get(sweep.bound)
        return
    knee, past = steps[knee_i], steps[knee_i + 1]
    sweep.knee = knee.concurrency
    sweep.bound = _bound(past, steps)
    sweep.why = (
        f"from concurrency {knee.concurrency} to {past.concurrency} throughput went "
        f"{knee.tok_per_s:g} → {past.tok_per_s:g} tokens/s while p99 latency went "
        f"{_latency(knee):.0f} → {_latency(past):.0f} ms"
    )
    sweep.next_step = NEXT.get(sweep.bound)


def _bound(past: Step, steps: list[Step]) -> str:
    m = past.metrics
    if m:
        if m.get("kv_usage", 0) >= KV_FULL or m.get("preemptions", 0) > 0:
            return "kv"
        if m.get("waiting", 0) > 0 and m.get("kv_usage", 0) < KV_SPARE:
            return "scheduler"
        if m.get("waiting", 0) == 0:
            return "compute"
    base = steps[0].tpot_p50_ms
    if base and past.tpot_p50_ms and past.tpot_p50_ms >= 1.5 * base:
        return "compute"  # each token slows as the batch grows: the GPU is the limit
    return "unknown"


NEXT = {
    "kv": "more KV cache: raise gpu_memory_utilization, kv_cache_dtype fp8, a shorter max_model_len, or more GPUs",
    "scheduler": "raise max_num_seqs (max-running-requests): requests queue while the KV cache has room",
    "compute": "the GPU is saturated: more GPUs (tensor_parallel_size) or a smaller / quantized model; "
    "serve at or below the knee's concurrency",
}
