"""Parallelism: tensor and pipeline parallel sizes that divide the heads and fit the GPUs,
and NCCL."""

from __future__ import annotations

from .core import Advisor, as_int, divisors_at_most, power_of_two_at_most

GROWS_WITH_MEMORY = ("oom", "kv_cache_too_small", "preemption")  # more GPUs is the way out


def tp_valid(a: Advisor, want_more: bool) -> None:
    f = a.finding
    known = a.ctx.current("tensor_parallel_size") if "tensor_parallel_size" in a.ctx.launch else None
    cur = as_int(known) or 1
    if known is None and f.ranks:
        cur = max(cur, max(f.ranks) + 1)  # the log ran this many workers at least
        known = cur
    gpus = as_int(f.facts.get("gpus") or f.facts.get("gpus2") or f.facts.get("gpus3")) or a.ctx.visible_gpus
    heads = as_int(f.facts.get("heads") or f.facts.get("numerator"))
    denom = as_int(f.facts.get("tensor_parallel_size") or f.facts.get("denominator"))
    if denom:
        cur, known = denom, denom
    if want_more:
        to = cur * 2
        if gpus is None or to <= gpus:
            a.add(
                "tensor_parallel_size",
                to,
                f"splits the weights over {to} GPUs instead of {cur}, halving what each must hold",
                cur,
            )
        return
    if known is None and gpus is None and not heads:
        a.add(
            "tensor_parallel_size",
            "a divisor of the model's (KV) heads",
            "the log shows neither the size used nor the head count; config.json has "
            "num_attention_heads and num_key_value_heads",
        )
        return
    cap = gpus if gpus is not None else max(1, cur - 1)
    if heads:
        options = divisors_at_most(heads, cap)
        to = options[-1] if options else 1
        why = f"{heads} heads split evenly over {to} ranks" + (
            f" and {gpus} GPUs are visible" if gpus else ""
        )
    else:
        to = power_of_two_at_most(cap)
        why = (
            f"only {gpus} GPUs are visible"
            if gpus is not None
            else f"{cur} does not fit; a power of two divides the heads of nearly every model"
        )
    if to != cur:
        a.add("tensor_parallel_size", to, why, cur)


def tensor_parallel_size(a: Advisor) -> None:
    tp_valid(a, want_more=a.finding.cls in GROWS_WITH_MEMORY)


def pipeline_parallel_size(a: Advisor) -> None:
    cur = as_int(a.ctx.current("pipeline_parallel_size")) or 1
    if a.finding.cls != "tp_mismatch":
        a.add(
            "pipeline_parallel_size", cur * 2, f"splits the layers over {cur * 2} stages (GPUs or nodes)", cur
        )
    elif cur > 1:
        a.add(
            "pipeline_parallel_size",
            1,
            "this model cannot be split into pipeline stages; use tensor parallelism",
            cur,
        )


def tp_mismatch(a: Advisor) -> None:
    tp_valid(a, want_more=False)


def nccl(a: Advisor) -> None:
    f = a.finding
    if "segment" in f.facts or "/dev/shm" in f.evidence:
        a.value("shm_size")
    a.value("env:NCCL_DEBUG")
    a.value("env:NCCL_P2P_DISABLE")


VALUES = {"tensor_parallel_size": tensor_parallel_size, "pipeline_parallel_size": pipeline_parallel_size}
CLASSES = {"tp_mismatch": tp_mismatch, "nccl": nccl}
