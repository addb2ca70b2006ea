"""Cross-check a scan against a GPU snapshot: most "won't start" cases are a mismatch there.

- tensor × pipeline parallel size above the visible GPUs is a tp_mismatch, whatever the log says;
- memory held by other processes turns an OOM or low-free-memory error into gpu_busy evidence;
- a capacity in the log that no snapshot GPU has means the process saw another device.
"""

from __future__ import annotations

from typing import Any

from ..host.gpus import DeviceSnapshot, Warning_
from ..model.records import Finding
from .engine_numbers import gpu_busy_from

CAPACITY_TOLERANCE = 0.03  # torch reports total capacity a little below nvidia-smi's


def parallel_size(launch: dict[str, Any], observed: dict[str, Any]) -> int | None:
    tp = launch.get("tensor_parallel_size") or observed.get("tensor_parallel_size")
    pp = launch.get("pipeline_parallel_size") or 1
    try:
        return int(tp) * int(pp) if tp else None
    except (TypeError, ValueError):
        return None


def capacity_warning(findings: list[Finding], snap: DeviceSnapshot) -> Warning_ | None:
    totals = [g.memory_total_mib / 1024 for g in snap.gpus if g.memory_total_mib]
    for f in findings:
        logged = f.facts.get("total_gib") or f.facts.get("gpu_total_gib")
        if not isinstance(logged, (int, float)) or not totals:
            continue
        if not any(abs(logged - t) / t <= CAPACITY_TOLERANCE for t in totals):
            shown = "/".join(f"{t:.1f}" for t in sorted(set(round(t, 1) for t in totals)))
            return Warning_(
                "visible_devices",
                f"the log's GPU has {logged} GiB but the snapshot shows {shown} GiB: "
                "the process saw a different device (container or CUDA_VISIBLE_DEVICES)",
            )
    return None


def cross_check(
    findings: list[Finding],
    snap: DeviceSnapshot,
    launch: dict[str, Any],
    observed: dict[str, Any],
    failed: bool,
) -> tuple[list[Finding], dict[str, Any]]:
    """New findings from the snapshot, and the JSON `device` object."""
    out: list[Finding] = []
    size = parallel_size(launch, observed)
    summary = snap.summary()
    severity = "fatal" if failed else "warning"
    if size is not None and size > snap.count:
        out.append(
            Finding(
                rule="device.too-few-gpus",
                cls="tp_mismatch",
                severity=severity,
                source="--gpus",
                line=0,
                title=f"The parallel size asks for {size} GPUs but {snap.count} are visible",
                evidence=summary,
                facts={"tensor_parallel_size": size, "gpus": snap.count},
            )
        )
    memory_failure = next((f for f in findings if f.layer == "memory" and f.severity == "fatal"), None)
    busy = [g for g in snap.gpus if g.memory_used_mib is not None and g.memory_used_mib > 1024]
    if busy and memory_failure is not None:
        g = max(busy, key=lambda x: x.memory_used_mib or 0)
        facts: dict[str, Any] = {"gpu": g.index, "used_gib": g.used_gib, "total_gib": g.total_gib}
        if g.processes:
            top = max(g.processes, key=lambda p: p.used_mib or 0)
            facts.update(
                other_pid=top.pid,
                other_name=top.name,
                other_gib=round((top.used_mib or 0) / 1024, 2),
                self_listed="snapshot",
            )
        # the log's own memory error is the evidence; the snapshot says whose memory it was
        out.append(
            gpu_busy_from(
                memory_failure,
                "device.gpu-busy",
                f"GPU {g.index} already had {g.used_gib} GiB in use by another process",
                {**facts, **memory_failure.facts},  # the log at crash time wins
                f"from the snapshot: {summary}",
                severity,
            )
        )
    warns = snap.warnings(size)
    cap = capacity_warning(findings, snap)
    if cap is not None:
        warns.append(cap)
    device = snap.to_json(size)
    device["warnings"] = [w.to_json() for w in warns]
    return out, device
