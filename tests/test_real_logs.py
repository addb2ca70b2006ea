"""The real logs in ../shared/real-logs (skipped when absent): each log is its own test.

A log is judged as `../shared/tools/score` judges it: the primary class (and OOM phase) the
label names, no fatal finding and no advice on a healthy log, `failed` for an `other` failure,
and for a hang either the hang class or an honest `incomplete` that names the phase.

Known misses are listed below by name with their cause. They run as strict xfails, so a log
that starts passing fails the suite until it is taken off the list: a regression cannot hide
behind an aggregate, and an improvement cannot go unnoticed.
"""

from __future__ import annotations

import pytest
import yaml

from .conftest import REAL_LOGS

CASES = sorted(p for p in REAL_LOGS.glob("*/label.yaml")) if REAL_LOGS.is_dir() else []
pytestmark = pytest.mark.skipif(not CASES, reason="../shared/real-logs not present")

EXPECT = {
    "oom_load": ({"oom"}, "load"),
    "oom_startup": ({"oom", "kv_cache_too_small"}, "startup"),
    "oom_runtime": ({"oom"}, "runtime"),
    "gpu_busy": ({"gpu_busy"}, None),
    "tp_mismatch": ({"tp_mismatch"}, None),
    "nccl": ({"nccl"}, None),
    "port_in_use": ({"port_in_use"}, None),
    "weights_format": ({"weights_format"}, None),
    "version": ({"weights_format", "driver"}, None),
    "preemption": ({"preemption"}, None),
    "retract": ({"preemption"}, None),
    "hang": ({"hang"}, None),
    "driver": ({"driver"}, None),
    "request": ({"request"}, None),
}

# name -> why the tool still gets it wrong (the cause, not the symptom).
KNOWN_MISSES: dict[str, str] = {
    "sglang-021-llama4-400k-input-runtime-crash": (
        "the log ends inside the scheduler traceback, before its exception line: the OOM is in the "
        "issue title, not in the log; the stack shows a forward pass and nothing names memory"
    ),
    "sglang-217-request-qwen2-vl-mrope-image-index-error-livelock": (
        "a bare IndexError in the multimodal rope position code, from one request's images; a "
        "wrapper logger re-emits every line at INFO, and no word ties an IndexError to a request"
    ),
    "vllm-212-driver-wsl2-marlin-repack-cuda-driver-oom-expandable-segments": (
        "the log says 'CUDA driver error: out of memory' and reads as an OOM; that WSL2's driver "
        "(with expandable segments) is the cause is known from the thread, not the log"
    ),
}


def lab_false(label: dict, key: str) -> bool:  # type: ignore[type-arg]
    return label.get(key) is False


def judge(label: dict, d) -> str | None:  # type: ignore[no-untyped-def]
    """None when the diagnosis agrees with the label, else what is wrong."""
    want = label["class"]
    p = d.primary
    got = f"got {d.status}/{p and p.cls}/{p and p.oom_phase}"
    if want == "healthy":
        fatal = any(f.severity == "fatal" for f in d.findings)
        # a request the server refused is told with its change; the server itself is healthy
        told = not d.advice or (p is not None and p.cls == "request")
        ok = d.status in ("ready", "incomplete") and not fatal and told
        return None if ok else f"false alarm: {got}"
    if want == "other" or lab_false(label, "decidable_from_log"):
        # a failure outside the named classes, or one whose class only the thread tells: it failed
        return None if d.status == "failed" else got
    classes, phase = EXPECT[want]
    if lab_false(label, "oom_phase_from_log"):
        phase = None  # only the thread tells the OOM's phase: any phase counts
    if want == "hang" and d.status == "incomplete" and p is None and d.last_phase:
        return None
    if p is None or p.cls not in classes:
        return got
    if phase is not None and p.oom_phase != phase:
        return f"wrong OOM phase: {got}"
    return None


def _params():  # type: ignore[no-untyped-def]
    for label in CASES:
        name = label.parent.name
        marks = []
        if name in KNOWN_MISSES:
            marks.append(pytest.mark.xfail(reason=KNOWN_MISSES[name], strict=True))
        yield pytest.param(label, id=name, marks=marks)


@pytest.mark.parametrize("label", list(_params()))
def test_real_log(know, label):  # type: ignore[no-untyped-def]
    from diagnose.pipeline.scan import scan_paths

    lab = yaml.safe_load(label.read_text())
    d = scan_paths([str(label.parent / "log.txt")], know)
    problem = judge(lab, d)
    assert problem is None, problem


def test_known_misses_exist():
    """Every name on the known-miss list is a log in the corpus (no stale entries)."""
    names = {p.parent.name for p in CASES}
    assert not set(KNOWN_MISSES) - names


# excerpts in which no engine printed a line of its own (one error line, NCCL's debug, a
# registry message SGLang copied from vLLM): the thread says the engine, not the log
ENGINE_NOT_IN_LOG = {
    "sglang-009-runtime-port-10000-errno98",
    "sglang-010-glm4-arch-not-supported",
    "sglang-013-runtime-oom-long-context-prefill",
    "sglang-022-stuck-graph-capture-two-nodes-nccl-debug",
    "tgi-006-nccl-watchdog-allreduce-timeout",
    "vllm-054-oom-runtime-qwen3vl-4b-rtx3090-no-chunked-prefill",
}


@pytest.mark.skipif(not CASES, reason="../shared/real-logs is absent")
def test_every_real_log_is_given_its_own_engine(know):  # type: ignore[no-untyped-def]
    """An engine's own line (SGLang's ServerArgs, vLLM's server modules, Ollama's lib/ollama
    backends) outranks the lines of what it imports (vLLM's platform detection and frames in
    SGLang; llama.cpp's loader in Ollama): no log gets another engine than its label's."""
    from diagnose.pipeline.scan import scan_paths

    wrong, generic = [], []
    for label in CASES:
        want = yaml.safe_load(label.read_text()).get("engine")
        got = scan_paths([str(label.parent / "log.txt")], know).engine.name
        if got == "generic" and want != "generic":
            generic.append(label.parent.name)
        elif want and got != want:
            wrong.append((label.parent.name, want, got))
    assert wrong == []
    assert set(generic) == ENGINE_NOT_IN_LOG
