"""The GPUs a launch can be placed on, one by one (`GpuPool`): what CUDA can use of each, what
others already hold there, which are busy or unreadable; and where a launch of N GPUs lands —
the engine's own order (the first N visible) or the freest N, named by a CUDA_VISIBLE_DEVICES
to put before the command.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .gpus import BUSY_MIB, DeviceSnapshot

# nvidia-smi's memory.total is more than the CUDA runtime (and so torch and the engines) sees:
# RTX 3090 24,576 MiB vs 23.69 GiB, T4 15,360 MiB vs 14.56 GiB, H100 81,559 MiB vs 79.18 GiB,
# H200 143,771 MiB vs 139.72 GiB, A100 80GB 81,920 MiB vs 79.25 GiB (real logs): 0.3-0.75 GiB.
CUDA_UNSEEN_GIB = 0.45


@dataclass(frozen=True, slots=True)
class PoolGpu:
    index: int  # nvidia-smi's index: what CUDA_VISIBLE_DEVICES names
    name: str | None
    usable_gib: float  # what CUDA sees of it
    used_gib: float  # held by other processes
    error: bool = False  # ERR! in nvidia-smi: nothing can be placed on it

    @property
    def free_gib(self) -> float:
        return self.usable_gib - self.used_gib

    @property
    def busy(self) -> bool:
        return self.used_gib * 1024 > BUSY_MIB


@dataclass(frozen=True, slots=True)
class Placement:
    """N GPUs a launch runs on: the smallest of them and the busiest decide each GPU's budget."""

    indices: tuple[int, ...]
    total_gib: float
    used_gib: float
    name: str | None
    engine_order: bool  # the first N visible, as the engine takes them without CUDA_VISIBLE_DEVICES


@dataclass(slots=True)
class GpuPool:
    gpus: list[PoolGpu]
    summary: str
    source: str = "given"  # given (NxGIB) / assumed / a snapshot's source
    notes: list[str] = field(default_factory=list)  # busy, mixed models or drivers, hidden GPUs
    visible: str | None = None  # CUDA_VISIBLE_DEVICES the pool was narrowed by
    mixed: bool = False  # several GPU models: CUDA orders them fastest first unless told

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def healthy(self) -> list[PoolGpu]:
        return [g for g in self.gpus if not g.error]

    @property
    def name(self) -> str | None:
        """The smallest GPU's model: what every GPU of a tensor-parallel group supports."""
        named = [g for g in self.gpus if g.name]
        return min(named, key=lambda g: g.usable_gib).name if named else None

    @property
    def busy(self) -> list[PoolGpu]:
        return [g for g in self.gpus if g.busy]

    def placed(self, n: int, engine_order: bool = False) -> Placement | None:
        """Where a launch of `n` GPUs runs: the first `n` visible when `engine_order` (what the
        engine does without CUDA_VISIBLE_DEVICES), else the `n` with the most free memory (ties:
        the lower index). None when fewer than `n` GPUs can take it."""
        if engine_order:
            chosen = self.gpus[:n]
            if len(chosen) < n:
                return None
        else:
            pool = sorted(self.healthy, key=lambda g: (-round(g.free_gib, 1), g.index))
            if len(pool) < n:
                return None
            chosen = sorted(pool[:n], key=lambda g: self.gpus.index(g))
        first = tuple(g.index for g in self.gpus[:n])
        indices = tuple(g.index for g in chosen)
        smallest = min(chosen, key=lambda g: g.usable_gib)
        return Placement(
            indices,
            smallest.usable_gib,
            max(g.used_gib for g in chosen),
            smallest.name,
            indices == first,
        )

    def placement_env(self, indices: tuple[int, ...]) -> dict[str, str]:
        """The variables that put a launch on these GPUs (nvidia-smi's indices; on mixed models
        CUDA orders them fastest first unless told to follow the PCI bus as nvidia-smi does)."""
        env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"} if self.mixed else {}
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in indices)
        return env

    def visible_prefix(self, where: Placement) -> str:
        """What to put before the command so the engine runs on `where` ("" when it would anyway)."""
        if where.engine_order and self.visible is None and not self.mixed:
            return ""
        return "".join(f"{k}={v} " for k, v in self.placement_env(where.indices).items())


def uniform_pool(count: int, gib: float, summary: str, source: str = "given", used: float = 0.0) -> GpuPool:
    """`NxGIB` or assumed: N identical GPUs of which CUDA can use all (`used` held on each)."""
    return GpuPool([PoolGpu(i, None, gib, used) for i in range(count)], summary, source)


def pool_from_snapshot(snap: DeviceSnapshot) -> GpuPool:
    """Each GPU of the snapshot as CUDA sees it (the driver's reserve off nvidia-smi's total, a
    MIG instance for a split GPU), what others hold on it, and the snapshot's warnings."""
    notes = [w.text for w in snap.warnings() if w.kind != "busy"]
    for g in snap.gpus:
        if (g.memory_used_mib or 0) > BUSY_MIB:
            procs = ", ".join(f"pid {p.pid} {p.name}" for p in g.processes)
            notes.insert(
                0,
                f"GPU {g.index} is busy ({(g.memory_used_mib or 0) / 1024:.1f} GiB in use"
                + (f" by {procs}" if procs else "")
                + "): a launch placed here avoids it; one that takes it has that much less",
            )
    split = [g for g in snap.gpus if g.mig_mib]
    if split:  # a server runs on one MIG instance: the smallest is what is sure to be there
        g = min(split, key=lambda g: min(g.mig_mib))
        smallest = min(g.mig_mib) / 1024
        one = PoolGpu(g.index, g.name, smallest, 0.0, g.error)
        summary = snap.summary() + f"; one MIG instance of {smallest:.1f} GiB"
        return GpuPool([one], summary, snap.source, notes, snap.visible)
    gpus: list[PoolGpu] = []
    said = set()
    for g in snap.gpus:
        if not g.memory_total_mib:
            continue  # no size (unified memory): the caller asks for one
        if g.memory_reserved_mib is not None:  # -q and memory.reserved say it exactly
            reserve, how = g.memory_reserved_mib / 1024, "as the driver reserves"
        else:
            reserve, how = CUDA_UNSEEN_GIB, "typical of the driver's reserve"
        said.add((round(reserve, 2), how))
        usable = g.memory_total_mib / 1024 - reserve
        gpus.append(PoolGpu(g.index, g.name, usable, (g.memory_used_mib or 0) / 1024, g.error))
    unseen = " / ".join(f"{r:.2f} GiB less" for r, _ in sorted(said))
    hows = " / ".join(sorted({how for _, how in said}))
    return GpuPool(
        gpus,
        snap.summary() + (f" (CUDA sees {unseen} of each than nvidia-smi's total, {hows})" if said else ""),
        snap.source,
        notes,
        snap.visible,
        mixed=len(snap.model_groups()) > 1,
    )
