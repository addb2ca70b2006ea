"""The host and its GPUs: another process on the GPU, which GPUs to use, and a GPU that is
busy before the engine starts."""

from __future__ import annotations

import math

from .core import UTIL_MAX, UTIL_STEP, Advisor, as_float


def free_gpu(a: Advisor) -> None:
    f = a.finding
    pid, gib = f.facts.get("other_pid"), f.facts.get("other_gib")
    free, total = f.facts.get("free_gib"), f.facts.get("total_gib")
    if pid and gib and f.facts.get("self_listed"):
        why = f"process {pid} holds {gib} GiB on GPU {f.facts.get('gpu', '?')}"
    elif f.cls == "gpu_busy" and free is not None and total:
        why = f"only {free} of {total} GiB are free: another process holds the rest"
    elif free is not None and total:
        own, tot, fr = as_float(f.facts.get("process_gib")), as_float(total), as_float(free)
        if own is not None and tot and fr is not None and tot - fr - own < max(0.5, 0.02 * tot):
            return  # the failing process itself holds what is used: nobody else to stop
        why = f"only {free} of {total} GiB were free; make sure no other process shares this GPU"
    else:
        why = "another process holds memory on this GPU"
    a.add("action:free_gpu", "stop the other process on the GPU (see `nvidia-smi`)", why)


def cuda_visible_devices(a: Advisor) -> None:
    idle = a.ctx.idle_gpus
    if idle:
        a.add(
            "env:CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in idle), "the snapshot shows these GPUs idle"
        )
    else:
        a.add(
            "env:CUDA_VISIBLE_DEVICES",
            "<idle GPU ids>",
            "start the server on GPUs no other process uses (check `nvidia-smi`)",
        )


def gpu_busy(a: Advisor) -> None:
    f = a.finding
    free_gpu(a)
    cuda_visible_devices(a)
    free, total = as_float(f.facts.get("free_gib")), as_float(f.facts.get("total_gib"))
    if free is not None and total:
        to = math.floor(free / total / UTIL_STEP) * UTIL_STEP
        if to >= 0.3:
            a.add(
                "gpu_memory_utilization",
                round(min(to, UTIL_MAX), 2),
                f"fits in the {free} of {total} GiB that are free",
                a.ctx.current("gpu_memory_utilization"),
            )


VALUES = {"action:free_gpu": free_gpu, "env:CUDA_VISIBLE_DEVICES": cuda_visible_devices}
CLASSES = {"gpu_busy": gpu_busy}
