"""The GPUs a plan or check is for, as the user gave them: `--gpus FILE` (an nvidia-smi snapshot,
each GPU on its own: what CUDA sees of it, what others hold there, narrowed by
CUDA_VISIBLE_DEVICES) or `NxGIB`, or assumed when not given."""

from __future__ import annotations

import os
import re

from ..base.errors import InputError
from ..host.gpu_pool import GpuPool, pool_from_snapshot, uniform_pool


def gpus_from(spec: str | None, parallel: int | None = None, visible: str | None = None) -> GpuPool:
    """--gpus FILE (an nvidia-smi snapshot) or NxGIB → the pool of GPUs. A snapshot is narrowed
    by `visible` (the launch's own CUDA_VISIBLE_DEVICES), else by this environment's."""
    from ..budget.config import parse_gpus_spec
    from ..host.gpus import apply_visible_devices
    from ..pipeline.scan import load_snapshot

    if spec is None:
        n = parallel or 1
        return uniform_pool(n, 80.0, f"assumed {n}× 80 GiB (give --gpus FILE or --gpus {n}x80)", "assumed")
    parsed = parse_gpus_spec(spec)
    if parsed:
        return uniform_pool(parsed[0], parsed[1], f"{parsed[0]}× {parsed[1]:g} GiB (given)")
    snap, err = load_snapshot(spec)
    if snap is None:
        raise InputError(f"{spec}: {err}")
    cvd = visible if visible is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    snap = apply_visible_devices(snap, cvd)
    if not snap.gpus:
        raise InputError(f"{spec}: CUDA_VISIBLE_DEVICES={cvd} leaves no GPU of this snapshot visible")
    pool = pool_from_snapshot(snap)
    if not pool.gpus:
        name = snap.gpus[0].name
        why = (
            "unified memory, shared with the CPU" if any(g.unified for g in snap.gpus) else "no memory column"
        )
        named = re.search(r"(\d+)\s*GB\b", name or "", re.I)
        example = f"{snap.count}x{named.group(1)}" if named else f"{snap.count}xGIB"
        raise InputError(
            f"{spec}: the snapshot gives no memory size ({why}): give the memory the GPU can use, "
            f"e.g. --gpus {example}"
        )
    return pool
