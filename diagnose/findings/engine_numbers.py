"""Evidence from the engine's own numbers, when the exception that would say it is missing.

A log cut right after the engine sized its memory (a pasted excerpt, a container killed
mid-raise, a traceback lost to another stream) still carries the values the engine printed.
The relations the engines themselves check are checked here, once, for every engine, from
the values the profiles' `observe` markers read:

- the KV-cache memory profiling left is zero or negative (vLLM V1 "Available KV cache
  memory", V0 "the rest of the memory reserved for KV Cache is");
- no KV block or token fits (vLLM "# GPU blocks: 0", any engine's KV size of 0 tokens);
- the blocks V0 allocated hold fewer tokens than one max_model_len request (vLLM raises
  "max seq len … larger than … KV cache" right after printing them);
- SGLang's free memory after the weights is below the share it keeps outside its static
  pool, (1 − mem_fraction_static) × the free memory at start: the KV pool gets nothing.

Each gives a `kv_cache_too_small` finding with the values as facts and the line that
printed the telling value as evidence; none is drawn once a memory failure is already
found or the server became ready.

And the allocator's own account of an OOM (`others_hold_the_gpu`): PyTorch lists every process
on the device ("Process N has X memory in use", this one as "this process has X"); other
processes holding a quarter of the GPU or more make it a `gpu_busy` failure, whatever the
engine and without a snapshot.

And what the server did against what it planned (`planned_on_gpu_ran_on_cpu`): llama.cpp's
runner (llama-server, Ollama) that was asked for layers on the GPU but offloaded none runs on
the CPU, silently: a `driver` failure though nothing errored.
"""

from __future__ import annotations

import math
import re

from ..knowledge.settings_in_force import value_in_force
from ..model.records import Finding
from ..model.typed_facts import as_float, as_int, size_gib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..knowledge.engine_profiles import Profiles
    from ..match.scanner import ScanResult


def _finding(
    result: ScanResult, source: str, key: str, rule: str, title: str, why: str, facts: dict[str, Any]
) -> Finding:
    number, text = result.observed_where.get(key, (0, ""))
    return Finding(
        rule=f"consistency.{rule}",
        cls="kv_cache_too_small",
        severity="fatal",
        title=title,
        line=number,
        source=source,
        evidence=text,
        facts=facts,
        oom_phase="startup",
        phase_evidence="the KV cache is sized after the weights load",
        confidence="medium",
        note=f"from the engine's own numbers: {why}; the exception that says so is not in the log",
    )


def check(
    result: ScanResult, profiles: Profiles, engine: str, findings: list[Finding], source: str
) -> list[Finding]:
    """Findings the engine's numbers prove and nothing else in the log says (the first that holds)."""
    if "ready" in result.phase_last_line or any(
        f.severity == "fatal" and f.layer == "memory" for f in findings
    ):
        return []
    launch = {k: v for k, v in result.launch.items() if v is not None}  # None in a dump: the default
    for proof in (_kv_memory_not_positive, _kv_capacity_zero, _kv_below_max_len, _static_pool_empty):
        f = proof(result, launch, profiles, engine, source)
        if f is not None:
            return [f]
    return []


def _kv_memory_not_positive(
    result: ScanResult, launch: dict[str, Any], profiles: Profiles, engine: str, source: str
) -> Finding | None:
    avail = result.observed.get("kv_avail_gib")
    if not (isinstance(avail, float | int) and avail <= 0):
        return None
    return _finding(
        result,
        source,
        "kv_avail_gib",
        "kv-memory-not-positive",
        "Profiling left no memory for the KV cache",
        f"{avail} GiB were left for the KV cache after weights and activations",
        {"available_gib": avail},
    )


def _kv_capacity_zero(
    result: ScanResult, launch: dict[str, Any], profiles: Profiles, engine: str, source: str
) -> Finding | None:
    obs = result.observed
    key = next((k for k in ("gpu_blocks", "kv_tokens") if isinstance(obs.get(k), int) and obs[k] <= 0), None)
    if key is None:
        return None
    said = "at zero" if obs[key] == 0 else f"below zero ({obs[key]:,}: the weights left less than nothing)"
    return _finding(
        result,
        source,
        key,
        "kv-capacity-zero",
        "No KV-cache block fits in the memory left",
        f"the engine sized its KV cache {said}",
        {key: obs[key]},
    )


def _kv_below_max_len(
    result: ScanResult, launch: dict[str, Any], profiles: Profiles, engine: str, source: str
) -> Finding | None:
    """A block count without the tokens (vLLM V0): blocks × the block size in force (its
    profile's default) against max_model_len."""
    obs = result.observed
    blocks = obs.get("gpu_blocks")
    max_len = obs.get("max_model_len") or result.launch.get("max_model_len")
    block_size = as_int(value_in_force("block_size", launch, profiles, engine, observed=obs))
    if not (block_size and isinstance(blocks, int) and isinstance(max_len, int) and "kv_tokens" not in obs):
        return None
    tokens = blocks * block_size
    if tokens >= max_len:
        return None
    return _finding(
        result,
        source,
        "gpu_blocks",
        "kv-capacity-below-max-len",
        "KV cache cannot hold one request of max_model_len",
        f"{blocks} blocks × {block_size} tokens = {tokens} tokens, below max_model_len {max_len}",
        {"kv_tokens": tokens, "max_model_len": max_len, "gpu_blocks": blocks},
    )


def _static_pool_empty(
    result: ScanResult, launch: dict[str, Any], profiles: Profiles, engine: str, source: str
) -> Finding | None:
    """A static pool (SGLang): (1 − fraction) of the memory free at start must stay free
    after the weights, or no KV pool is left."""
    obs = result.observed
    start, after = obs.get("free_start_gib"), obs.get("free_after_weights_gib")
    static = profiles.get(engine).memory.get("kv_budget") == "free_static"
    if not (static and isinstance(start, float | int) and isinstance(after, float | int) and start > 0):
        return None
    mfs = as_float(value_in_force("gpu_memory_utilization", launch, profiles, engine, observed=obs))
    if mfs is None or after - start * (1 - mfs) > 0:
        return None
    needed = math.ceil((1 - after / start) * 100) / 100 + 0.01
    return _finding(
        result,
        source,
        "free_after_weights_gib",
        "static-pool-empty",
        "No memory left for SGLang's KV pool under --mem-fraction-static",
        f"{after} GiB free after the weights is below (1 − {mfs}) × {start} GiB free at start",
        {"mem_fraction_static": mfs, "min_fraction": round(needed, 2), "free_after_weights_gib": after},
    )


# c10/cuda/CUDACachingAllocator.cpp (reportProcessMemoryInfo, torch >= 2.1): each process NVML
# sees on the device, the caller as "Including non-PyTorch memory, this process has X".
_PROCESS_HAS = re.compile(r"Process (\d+) has ([\d.,]+ ?[KMGT]?i?B) memory in use")
_THIS_PROCESS = re.compile(r"this process has [\d.,]+ ?[KMGT]?i?B memory in use")
BUSY_SHARE = 0.25  # others holding this much of the GPU while this process starts: gpu_busy


def others_hold_the_gpu(findings: list[Finding]) -> Finding | None:
    """The first fatal OOM whose allocator message shows other processes holding a quarter of
    the GPU or more. Where the message does not name this process (NVML sees host PIDs from a
    container's namespace), the largest entry may be this process and is not counted."""
    for f in findings:
        if f.cls != "oom" or f.severity != "fatal":
            continue
        total = as_float(f.facts.get("total_gib"))
        held = sorted(g for _, size in _PROCESS_HAS.findall(f.evidence) if (g := size_gib(size)) is not None)
        if not total or not held:
            continue
        if not _THIS_PROCESS.search(f.evidence):
            held = held[:-1]
        others = sum(held)
        if not held or others < BUSY_SHARE * total:
            continue
        return gpu_busy_from(
            f,
            "torch.oom.gpu-held-by-others",
            f"Other processes held {others:.1f} GiB ({others / total:.0%}) of GPU {f.facts.get('gpu', '?')}",
            {**f.facts, "others_gib": round(others, 2), "other_processes": len(held)},
            f"the allocator's own list: {len(held)} other process(es) held {others:.1f} of {total:g} GiB "
            "when this one ran out",
        )
    return None


def gpu_busy_from(
    failure: Finding, rule: str, title: str, facts: dict[str, Any], note: str, severity: str = "fatal"
) -> Finding:
    """A `gpu_busy` finding that stands on a memory failure of the log: its line, time and
    evidence; `facts` as the caller merged them with the failure's."""
    return Finding(
        rule=rule,
        cls="gpu_busy",
        severity=severity,
        source=failure.source,
        line=failure.line,
        time=failure.time,
        phase_at=failure.phase_at,
        title=title,
        evidence=failure.evidence,
        facts=facts,
        note=note,
    )


def planned_on_gpu_ran_on_cpu(result: ScanResult, source: str) -> Finding | None:
    """Layers planned on the GPU (Ollama's estimate, llama-server's -ngl) and none offloaded
    (llama.cpp's "offloaded 0/N layers to GPU"): the GPU backend is missing or saw no device."""
    obs = result.observed
    planned = as_int(obs.get("gpu_layers_planned"))
    if planned is None:
        planned = as_int(result.launch.get("gpu_layers"))
    done, total = as_int(obs.get("gpu_layers_offloaded")), as_int(obs.get("gpu_layers_total"))
    if not planned or planned <= 0 or done != 0:
        return None
    number, text = result.observed_where.get("gpu_layers_offloaded", (0, ""))
    asked = f"{planned}" if not total or planned <= total else f"all {total}"
    return Finding(
        rule="consistency.cpu-fallback",
        cls="driver",
        severity="error",
        title=f"{asked} layers were planned on the GPU and none was offloaded: the model runs on the CPU",
        line=number,
        source=source,
        evidence=text,
        facts={
            "gpu_layers_planned": planned,
            "gpu_layers_offloaded": 0,
            **({"gpu_layers_total": total} if total else {}),
        },
        note="the runner loaded no GPU backend (a CPU-only build) or found no device it could use",
    )
