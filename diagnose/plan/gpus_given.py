"""The GPUs a plan or check is for, as the user gave them: `--gpus FILE` (an nvidia-smi snapshot,
each GPU's memory less what CUDA never sees, the memory others use, a MIG instance) or `NxGIB`,
or assumed when not given."""

from __future__ import annotations

import re

from ..base.errors import InputError


def gpus_from(spec: str | None, parallel: int | None = None) -> tuple[int, float, float, str, str | None]:
    """--gpus FILE (an nvidia-smi snapshot) or NxGIB → (count, GiB each, GiB used by others,
    summary, the smallest GPU's model name when a snapshot names it: what the GPUs support)."""
    from ..budget.config import parse_gpus_spec
    from ..pipeline.scan import load_snapshot

    if spec is None:
        n = parallel or 1
        return n, 80.0, 0.0, f"assumed {n}× 80 GiB (give --gpus FILE or --gpus {n}x80)", None
    parsed = parse_gpus_spec(spec)
    if parsed:
        return parsed[0], parsed[1], 0.0, f"{parsed[0]}× {parsed[1]:g} GiB (given)", None
    snap, err = load_snapshot(spec)
    if snap is None:
        raise InputError(f"{spec}: {err}")
    from ..budget.units import CUDA_UNSEEN_GIB

    name = min(snap.gpus, key=lambda g: g.memory_total_mib or 0).name if snap.gpus else None
    mig = [m for g in snap.gpus for m in g.mig_mib]
    if mig:  # a server runs on one MIG instance: the smallest is what is sure to be there
        return (
            1,
            min(mig) / 1024,
            0.0,
            snap.summary() + f"; one MIG instance of {min(mig) / 1024:.1f} GiB",
            name,
        )
    totals = [g.memory_total_mib for g in snap.gpus if g.memory_total_mib]
    if not totals:
        why = (
            "unified memory, shared with the CPU" if any(g.unified for g in snap.gpus) else "no memory column"
        )
        named = re.search(r"(\d+)\s*GB\b", name or "", re.I)
        example = f"{snap.count}x{named.group(1)}" if named else f"{snap.count}xGIB"
        raise InputError(
            f"{spec}: the snapshot gives no memory size ({why}): give the memory the GPU can use, "
            f"e.g. --gpus {example}"
        )
    used = [g.memory_used_mib or 0 for g in snap.gpus]
    smallest = min((g for g in snap.gpus if g.memory_total_mib), key=lambda g: g.memory_total_mib or 0)
    if smallest.memory_reserved_mib is not None:  # -q and memory.reserved say it exactly
        unseen, how = smallest.memory_reserved_mib / 1024, "as the driver reserves"
    else:
        unseen, how = CUDA_UNSEEN_GIB, "typical of the driver's reserve"
    return (
        snap.count,
        (smallest.memory_total_mib or 0) / 1024 - unseen,
        max(used) / 1024 if used else 0.0,
        snap.summary() + f" (CUDA sees {unseen:.2f} GiB less of each than nvidia-smi's total, {how})",
        name,
    )
