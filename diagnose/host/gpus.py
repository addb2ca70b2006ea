"""A GPU snapshot (`DeviceSnapshot`): each GPU's model, memory, use, driver and processes, the
visible ones (`CUDA_VISIBLE_DEVICES`), and its one-line conclusion.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..base.errors import InputError

SEED_QUERY = ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.used,driver_version", "--format=csv"]
APPS_QUERY = ["nvidia-smi", "--query-compute-apps=gpu_bus_id,pid,process_name,used_memory", "--format=csv"]
BUSY_MIB = 1024  # a GPU with more than 1 GiB in use is busy (seed 000)

NO_DEVICES = "No devices were found"
NO_DRIVER = "couldn't communicate with the NVIDIA driver"


class DeviceError(InputError):
    """The snapshot cannot be read. `driver` is set when the output itself reports no GPU/driver."""

    def __init__(self, message: str, driver: bool = False):
        super().__init__(message)
        self.driver = driver


@dataclass(slots=True)
class GpuProcess:
    pid: int
    name: str
    used_mib: int | None
    gpu: int | None = None
    bus_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "name": self.name, "used_mib": self.used_mib}


@dataclass(slots=True)
class Gpu:
    index: int
    name: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    driver_version: str | None = None
    memory_free_mib: int | None = None
    uuid: str | None = None
    bus_id: str | None = None
    processes: list[GpuProcess] = field(default_factory=list)
    mig_mib: list[int] = field(default_factory=list)  # MIG instances' memory: what CUDA sees
    memory_reserved_mib: int | None = None  # -q "Reserved" / memory.reserved: what CUDA does not see
    unified: bool = False  # memory shared with the CPU (GB10, Jetson): nvidia-smi reports none
    error: bool = False  # its rows read ERR!: the driver cannot query it (Xid errors, a failing card)

    @property
    def total_gib(self) -> float | None:
        return None if self.memory_total_mib is None else round(self.memory_total_mib / 1024, 1)

    @property
    def used_gib(self) -> float | None:
        return None if self.memory_used_mib is None else round(self.memory_used_mib / 1024, 1)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "name": self.name,
            "memory_total_mib": self.memory_total_mib,
            "memory_used_mib": self.memory_used_mib,
            "driver_version": self.driver_version,
        }
        if self.memory_free_mib is not None:
            out["memory_free_mib"] = self.memory_free_mib
        if self.uuid:
            out["uuid"] = self.uuid
        if self.bus_id:
            out["bus_id"] = self.bus_id
        if self.memory_reserved_mib is not None:
            out["memory_reserved_mib"] = self.memory_reserved_mib
        if self.mig_mib:
            out["mig_instances_mib"] = list(self.mig_mib)
        if self.unified:
            out["memory"] = "not reported: unified memory shared with the CPU"
        if self.error:
            out["error"] = True
        out["processes"] = [p.to_json() for p in self.processes]
        return out


@dataclass(slots=True)
class Warning_:
    kind: str  # busy / mixed_driver / mixed_model / too_few_gpus / visible_devices
    text: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text}


@dataclass(slots=True)
class DeviceSnapshot:
    gpus: list[Gpu]
    source: str  # csv / table / query
    cuda_version: str | None = None
    visible: str | None = None  # CUDA_VISIBLE_DEVICES applied, as given
    hidden: list[int] = field(default_factory=list)  # indices the process cannot see
    notes: list[Warning_] = field(default_factory=list)  # from narrowing (unknown ids, …)

    @property
    def count(self) -> int:
        return len(self.gpus)

    def summary(self) -> str:
        """The seed's one-line conclusion."""
        if not self.gpus:
            return "0 GPUs visible"
        names = Counter(g.name for g in self.gpus)
        model = " + ".join(f"{n} ×{c}" if c > 1 else n for n, c in names.items())
        # one model's cards report a few MiB apart: its smallest total speaks for the group
        totals = sorted(
            {
                min(t)
                for t in ([g.total_gib for g in m if g.total_gib is not None] for m in self.model_groups())
                if t
            }
        )
        if len(totals) == 1:
            mem = f"{totals[0]:.1f} GiB each" if self.count > 1 else f"{totals[0]:.1f} GiB"
        elif totals:
            mem = "/".join(f"{t:.1f}" for t in totals) + " GiB"
        elif any(g.unified for g in self.gpus):
            mem = "unified memory (nvidia-smi reports no size: it is shared with the CPU)"
        else:
            mem = "memory size not in this output"
        used_s = self._use_text()
        drivers = sorted({g.driver_version for g in self.gpus if g.driver_version})
        if len(drivers) == 1:
            drv = f", driver {drivers[0]}" + (" on all" if self.count > 1 else "")
        elif drivers:
            drv = ", drivers differ (" + ", ".join(drivers) + ")"
        else:
            drv = ""
        return f"{self.count} GPU{'s' if self.count != 1 else ''} visible: {model}, {mem}{used_s}{drv}"

    def _use_text(self) -> str:
        """What others hold, GPU by GPU (a sum would read as one GPU's)."""
        known = [g for g in self.gpus if g.memory_used_mib is not None]
        if not known:
            return ""
        if self.count == 1:
            return f", {known[0].memory_used_mib / 1024:.1f} GiB used"  # type: ignore[operator]
        busy = [g for g in known if (g.memory_used_mib or 0) > BUSY_MIB]
        if not busy:
            return ", none busy"
        each = ", ".join(f"{(g.memory_used_mib or 0) / 1024:.1f} GiB on GPU {g.index}" for g in busy)
        return f", used: {each}"

    def warnings(self, parallel_size: int | None = None) -> list[Warning_]:
        out = list(self.notes)
        for g in self.gpus:
            if g.memory_used_mib is not None and g.memory_used_mib > BUSY_MIB:
                procs = ", ".join(
                    f"pid {p.pid} {p.name} {p.used_mib / 1024:.1f} GiB"
                    if p.used_mib
                    else f"pid {p.pid} {p.name}"
                    for p in g.processes
                )
                who = f" ({procs})" if procs else ""
                out.append(
                    Warning_(
                        "busy",
                        f"GPU {g.index} has {g.used_gib:.1f} GiB in use{who}: discount it from the "
                        "memory budget, or free the GPU",
                    )
                )
        for g in self.gpus:
            if g.error:
                out.append(
                    Warning_(
                        "gpu_error",
                        f"GPU {g.index} reports ERR! in nvidia-smi: the driver cannot read it (look for "
                        "Xid errors in `dmesg`); do not schedule on it until it reads clean",
                    )
                )
            if g.mig_mib:
                sizes = ", ".join(f"{m / 1024:.1f} GiB" for m in g.mig_mib)
                out.append(
                    Warning_(
                        "mig",
                        f"GPU {g.index} is split into {len(g.mig_mib)} MIG instances ({sizes}): CUDA "
                        "sees the instances, not the whole GPU, and a server gets one of them",
                    )
                )
        drivers = {g.driver_version for g in self.gpus if g.driver_version}
        if len(drivers) > 1:
            by = ", ".join(
                f"{d} on GPU {','.join(str(g.index) for g in self.gpus if g.driver_version == d)}"
                for d in sorted(drivers)
            )
            out.append(Warning_("mixed_driver", f"drivers differ: {by}"))
        groups = self.model_groups()
        if len(groups) > 1:
            out.append(
                Warning_(
                    "mixed_model",
                    "GPUs differ ("
                    + "; ".join(_group_text(members) for members in groups)
                    + "): tensor parallelism runs at the pace and memory of the smallest",
                )
            )
        healthy = sum(1 for g in self.gpus if not g.error)
        if parallel_size is not None and parallel_size > healthy:
            broken = self.count - healthy
            out.append(
                Warning_(
                    "too_few_gpus",
                    f"the parallel size asks for {parallel_size} GPUs but {self.count} "
                    f"{'is' if self.count == 1 else 'are'} visible"
                    + (f" and {broken} of them cannot be read (ERR!)" if broken else ""),
                )
            )
        return out

    def model_groups(self) -> list[list[Any]]:
        """GPUs grouped by model: one name, and totals within 1 % of each other (cards of one
        model report a few MiB apart: 32,764 and 32,768 MiB are the same V100)."""
        groups: list[list[Any]] = []
        for g in self.gpus:
            for members in groups:
                ref = members[0]
                same_total = (
                    g.memory_total_mib is None
                    or ref.memory_total_mib is None
                    or abs(g.memory_total_mib - ref.memory_total_mib)
                    <= 0.01 * max(g.memory_total_mib, ref.memory_total_mib)
                )
                if g.name == ref.name and same_total:
                    members.append(g)
                    break
            else:
                groups.append([g])
        return groups

    def to_json(self, parallel_size: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "count": self.count,
            "summary": self.summary(),
            "gpus": [g.to_json() for g in self.gpus],
            "warnings": [w.to_json() for w in self.warnings(parallel_size)],
            "source": self.source,
        }
        if self.cuda_version:
            out["cuda_version"] = self.cuda_version
        if self.visible is not None:
            out["cuda_visible_devices"] = self.visible
        return out


def ascii_digits(s: str) -> bool:
    """0-9 only: `str.isdigit` also takes ², ٣ and other digits `int` may refuse."""
    return s.isascii() and s.isdigit()


def apply_visible_devices(snap: DeviceSnapshot, cvd: str | None) -> DeviceSnapshot:
    """Narrow the snapshot to what a process with this CUDA_VISIBLE_DEVICES sees."""
    if cvd is None:
        return snap
    wanted = [x.strip() for x in cvd.split(",") if x.strip()]
    kept: list[Gpu] = []
    notes: list[Warning_] = []
    for w in wanted:
        match = None
        if ascii_digits(w):
            match = next((g for g in snap.gpus if g.index == int(w)), None)
        else:
            match = next((g for g in snap.gpus if g.uuid and g.uuid.startswith(w)), None)
        if match is None:
            notes.append(
                Warning_(
                    "visible_devices",
                    f"CUDA_VISIBLE_DEVICES names {w}, which the snapshot does not "
                    "have: CUDA stops at the first unknown id",
                )
            )
            break  # CUDA ignores everything after an invalid entry
        if match not in kept:
            kept.append(match)
    hidden = [g.index for g in snap.gpus if g not in kept]
    if hidden:
        notes.append(
            Warning_(
                "visible_devices", f"CUDA_VISIBLE_DEVICES={cvd} hides GPU " + ",".join(str(i) for i in hidden)
            )
        )
    return DeviceSnapshot(kept, snap.source, snap.cuda_version, cvd, hidden, notes)


def _group_text(members: list[Any]) -> str:
    totals = [g.total_gib for g in members if g.total_gib is not None]
    size = f" {min(totals):.1f} GiB" if totals else ""
    return f"GPU {','.join(str(g.index) for g in members)}: {members[0].name}{size}"
