"""GPU snapshots from nvidia-smi: the query CSV, the default table, `-q`; one-line conclusion.

The seeds start every deployment by pinning down the GPUs: how many are visible, how much
memory each has and uses, whether the drivers agree. This module reads what people paste
(any of the three formats, with or without units and headers) into one DeviceSnapshot.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyparsing as pp

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
        used = [g.memory_used_mib for g in self.gpus if g.memory_used_mib is not None]
        used_s = f", {sum(used) / 1024:.1f} GiB used" if used else ""
        drivers = sorted({g.driver_version for g in self.gpus if g.driver_version})
        if len(drivers) == 1:
            drv = f", driver {drivers[0]}" + (" on all" if self.count > 1 else "")
        elif drivers:
            drv = ", drivers differ (" + ", ".join(drivers) + ")"
        else:
            drv = ""
        return f"{self.count} GPU{'s' if self.count != 1 else ''} visible: {model}, {mem}{used_s}{drv}"

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


# --- parsing --------------------------------------------------------------------------------

_MIB_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(MiB|GiB|MB|GB|KiB)?\s*$", re.I)


def _ascii_digits(s: str) -> bool:
    """0-9 only: `str.isdigit` also takes ², ٣ and other digits `int` may refuse."""
    return s.isascii() and s.isdigit()


def _mib(v: str | None) -> int | None:
    if v is None:
        return None
    m = _MIB_RE.match(v)
    if not m:
        return None
    x = float(m.group(1))
    unit = (m.group(2) or "MiB").lower()
    factor = {"mib": 1, "mb": 1, "gib": 1024, "gb": 1024, "kib": 1 / 1024}[unit]
    return round(x * factor)


def _unreported(value: str | None) -> bool:
    """A memory size nvidia-smi does not give ("[N/A]", "Not Supported": GB10, Jetson)."""
    return (value or "").strip("[] ").lower() in ("n/a", "not supported")


def _check_failures(text: str) -> None:
    if NO_DRIVER in text or "NVIDIA-SMI has failed" in text:
        raise DeviceError(
            "nvidia-smi cannot talk to the NVIDIA driver: the driver is not loaded, or this "
            "container was started without GPU access",
            driver=True,
        )
    if NO_DEVICES in text:
        raise DeviceError("nvidia-smi found no GPU (No devices were found)", driver=True)


def parse_nvidia_smi(text: str) -> DeviceSnapshot:
    """Any of the three formats; raises DeviceError with a one-line reason otherwise."""
    if "\x00" in text:
        raise DeviceError("the snapshot is binary data, not nvidia-smi output")
    _check_failures(text)
    stripped = text.strip()
    if not stripped:
        raise DeviceError("the snapshot is empty: paste the output of " + " ".join(SEED_QUERY))
    lost = _LOST_RE.search(text)
    try:
        snap = _parse_any(text)
    except DeviceError:
        if lost:  # "Unable to determine the device handle for GPU…: Unknown Error"
            raise DeviceError(
                f"a GPU is lost to the driver ({lost.group(0).strip()[:120]})", driver=True
            ) from None
        raise
    if lost:
        snap.notes.append(
            Warning_(
                "gpu_lost",
                f"{lost.group(0).strip()[:120]}: a GPU fell off the bus or failed (Xid 79/119 in `dmesg`); "
                "it is missing from this list until the node is reset",
            )
        )
    return snap


_LOST_RE = re.compile(r"Unable to determine the device handle for GPU[^\n]*|GPU [0-9A-Fa-f:.]+ is lost[^\n]*")


def _parse_any(text: str) -> DeviceSnapshot:
    if "NVSMI LOG" in text or re.search(r"^\s*Product Name\s*:", text, re.M):
        return parse_query(text)
    if _LIST_RE.search(text):
        return parse_list(text)
    if re.search(r"^\s*\|.*(MiB|Driver Version)", text, re.M) or "+----" in text:
        return parse_table(text)
    return parse_csv(text)


# nvidia-smi -L: "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-…)", MIG devices indented under it
_LIST_RE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)\s*$", re.M)
_LIST_MIG_RE = re.compile(r"^\s+MIG (\d+)g\.(\d+)gb\s+Device\s+\d+:", re.M)


def parse_list(text: str) -> DeviceSnapshot:
    """`nvidia-smi -L`: the GPUs and their names (no memory sizes; a MIG profile names its
    memory, 3g.40gb)."""
    gpus: list[Gpu] = []
    for line in text.replace("\r\n", "\n").splitlines():
        m = _LIST_RE.match(line)
        if m:
            gpus.append(Gpu(int(m.group(1)), m.group(2).strip(), None, None, uuid=m.group(3)))
            continue
        mig = _LIST_MIG_RE.match(line)
        if mig and gpus:
            gpus[-1].mig_mib.append(int(mig.group(2)) * 1000)  # 3g.40gb has 40,192 MiB, 2g.20gb 19,968
    return DeviceSnapshot(gpus, "list")


# CSV: --query-gpu=…  --format=csv[,noheader][,nounits]; also --query-compute-apps
_FIELD_ALIASES = {
    "index": "index",
    "name": "name",
    "gpu_name": "name",
    "memory.total": "memory.total",
    "memory.used": "memory.used",
    "memory.free": "memory.free",
    "memory.reserved": "memory.reserved",
    "driver_version": "driver_version",
    "uuid": "uuid",
    "gpu_uuid": "uuid",
    "pci.bus_id": "bus_id",
    "gpu_bus_id": "bus_id",
    "pid": "pid",
    "process_name": "process_name",
    "used_memory": "used_memory",
    "used_gpu_memory": "used_memory",
}
SEED_FIELDS = ["index", "name", "memory.total", "memory.used", "driver_version"]


def _csv_rows(text: str) -> list[list[str]]:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    try:
        rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if any(c.strip() for c in r)]
    except csv.Error as e:
        raise DeviceError(f"not a CSV snapshot ({e})") from None
    return [[c.strip() for c in r] for r in rows]


def parse_csv(text: str) -> DeviceSnapshot:
    rows = _csv_rows(text)
    if not rows:
        raise DeviceError("no rows in the CSV snapshot")
    head = [re.sub(r"\s*\[.*\]$", "", c).strip().lower() for c in rows[0]]
    if any(h in _FIELD_ALIASES for h in head) and not _ascii_digits(rows[0][0].strip()):
        fields = [_FIELD_ALIASES.get(h, h) for h in head]
        body = rows[1:]
    else:
        # noheader: the seed's query order, or guess from the shape of the first row
        fields = _guess_fields(rows[0])
        body = rows
    if "pid" in fields and "index" not in fields:
        raise DeviceError(
            "this CSV lists processes only (--query-compute-apps); add the GPU query: " + " ".join(SEED_QUERY)
        )
    if "memory.total" not in fields or ("name" not in fields and "index" not in fields):
        raise DeviceError(
            "the CSV does not have the GPU name and memory.total columns; run " + " ".join(SEED_QUERY)
        )
    gpus: list[Gpu] = []
    for n, r in enumerate(body):
        if len(r) != len(fields):
            raise DeviceError(
                f"CSV row {n + 1} has {len(r)} fields, the header has {len(fields)}: truncated output?"
            )
        v = dict(zip(fields, r, strict=True))
        idx = v.get("index")
        gpus.append(
            Gpu(
                index=int(idx) if idx and _ascii_digits(idx) else n,
                name=v.get("name") or "GPU",
                memory_total_mib=_mib(v.get("memory.total")),
                memory_used_mib=_mib(v.get("memory.used")),
                memory_free_mib=_mib(v.get("memory.free")),
                memory_reserved_mib=_mib(v.get("memory.reserved")),
                driver_version=v.get("driver_version") or None,
                uuid=v.get("uuid"),
                bus_id=v.get("bus_id"),
                # GB10, Jetson: "[N/A]" / "[Not Supported]" where the size would be
                unified=_unreported(v.get("memory.total")),
            )
        )
    if not gpus:
        raise DeviceError("the CSV has a header but no GPU rows")
    return DeviceSnapshot(gpus, "csv")


def _guess_fields(row: list[str]) -> list[str]:
    if len(row) == len(SEED_FIELDS):
        return list(SEED_FIELDS)
    out: list[str] = []
    for c in row:
        if _ascii_digits(c) and "index" not in out:
            out.append("index")
        elif re.match(r"^GPU-[0-9a-f-]+$", c):
            out.append("uuid")
        elif re.match(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d$", c):
            out.append("bus_id")
        elif re.match(r"^\d+\.\d+(\.\d+)?$", c) and "driver_version" not in out:
            out.append("driver_version")
        elif _mib(c) is not None and "memory.total" not in out:
            out.append("memory.total")
        elif _mib(c) is not None and "memory.used" not in out:
            out.append("memory.used")
        elif "name" not in out and re.search(r"[A-Za-z]", c):
            out.append("name")
        else:
            out.append(f"unknown{len(out)}")
    return out


# Default table: a pyparsing grammar per row kind, tolerant of column widths and of the
# layout changes between driver generations (470 … 570).
def _table_grammar() -> dict[str, pp.ParserElement]:
    bar = pp.Suppress("|")
    integer = pp.Word(pp.nums).set_parse_action(lambda t: int(t[0]))
    persist = pp.one_of("On Off WDDM TCC MCDM N/A")  # Linux: persistence mode; Windows: driver model
    bus = pp.Regex(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]")
    name_word = ~(persist + bar) + pp.Word(pp.printables, exclude_chars="|")
    name = pp.original_text_for(pp.OneOrMore(name_word))
    gpu_row = (
        bar
        + integer("index")
        + name("name")
        + persist
        + bar
        + bus("bus_id")
        + pp.Optional(pp.Word(pp.alphas))
        + bar
    )
    mem = (
        integer("used")
        + pp.Suppress(pp.CaselessLiteral("MiB"))
        + pp.Suppress("/")
        + integer("total")
        + pp.Suppress(pp.CaselessLiteral("MiB"))
    )
    mem_row = bar + pp.SkipTo("|") + bar + mem + bar
    no_mem = bar + pp.SkipTo("|") + bar + (pp.CaselessLiteral("Not Supported") | pp.CaselessLiteral("N/A"))
    mig_row = bar + integer("gpu") + integer + integer + integer + bar + mem + bar
    ptype = pp.one_of("C G C+G M M+C")
    # GI/CI columns (drivers 450+); older tables go straight from the GPU to the PID
    gi = pp.Optional(
        pp.Word(pp.alphanums + "/") + pp.Word(pp.alphanums + "/") + pp.FollowedBy(integer + ptype)
    )
    proc_name = pp.original_text_for(
        pp.OneOrMore(
            ~(integer + pp.CaselessLiteral("MiB") | pp.Literal("N/A") + bar)
            + pp.Word(pp.printables, exclude_chars="|")
        )
    )
    proc_row = (
        bar
        + integer("gpu")
        + gi
        + integer("pid")
        + ptype("type")
        + proc_name("name")
        + (integer("used") + pp.Suppress(pp.CaselessLiteral("MiB")) | pp.Suppress(pp.Literal("N/A")))
        + bar
    )
    return {"gpu": gpu_row, "mem": mem_row, "no_mem": no_mem, "mig": mig_row, "proc": proc_row}


_TABLE = _table_grammar()
_DRIVER_RE = re.compile(r"Driver Version:\s*([\d.]+)")
_CUDA_RE = re.compile(r"CUDA Version:\s*([\d.]+)")


def parse_table(text: str) -> DeviceSnapshot:
    driver = _DRIVER_RE.search(text)
    cuda = _CUDA_RE.search(text)
    gpus: list[Gpu] = []
    procs: list[GpuProcess] = []
    in_procs = in_mig = False
    for raw in text.splitlines():
        line = raw.rstrip()
        if "Processes:" in line:
            in_procs, in_mig = True, False
            continue
        if "MIG devices:" in line:
            in_mig = True
            continue
        if not line.startswith("|"):
            continue
        if in_mig:
            try:
                r = _TABLE["mig"].parse_string(line, parse_all=False)
            except pp.ParseException:
                continue
            for g in gpus:
                if g.index == r["gpu"]:
                    g.mig_mib.append(r["total"])
            continue
        if in_procs:
            try:
                r = _TABLE["proc"].parse_string(line, parse_all=False)
            except pp.ParseException:
                continue
            procs.append(
                GpuProcess(pid=r["pid"], name=r["name"].strip(), used_mib=r.get("used"), gpu=r["gpu"])
            )
            continue
        try:
            r = _TABLE["gpu"].parse_string(line, parse_all=False)
            gpus.append(
                Gpu(
                    index=r["index"],
                    name=r["name"].strip(),
                    memory_total_mib=None,
                    memory_used_mib=None,
                    driver_version=driver.group(1) if driver else None,
                    bus_id=r["bus_id"],
                    error="ERR!" in line,
                )
            )
            continue
        except pp.ParseException:
            pass
        if "ERR!" in line and gpus:
            gpus[-1].error = True
        if gpus and gpus[-1].memory_total_mib is None and not gpus[-1].unified:
            try:
                r = _TABLE["mem"].parse_string(line, parse_all=False)
            except pp.ParseException:
                try:
                    _TABLE["no_mem"].parse_string(line, parse_all=False)
                    gpus[-1].unified = True  # "Not Supported": GB10, Jetson
                except pp.ParseException:
                    pass
                continue
            gpus[-1].memory_used_mib, gpus[-1].memory_total_mib = r["used"], r["total"]
    if not gpus:
        raise DeviceError(
            "no GPU rows in the nvidia-smi table: truncated, or a layout this parser does not know"
        )
    if any(g.memory_total_mib is None and not g.unified for g in gpus):
        raise DeviceError("a GPU row of the nvidia-smi table has no memory line: truncated output?")
    by_index = {g.index: g for g in gpus}
    for p in procs:
        if p.gpu in by_index:
            by_index[p.gpu].processes.append(p)
    return DeviceSnapshot(gpus, "table", cuda_version=cuda.group(1) if cuda else None)


# nvidia-smi -q: indented "Key : value" sections
_KV_RE = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*?)\s*$")


def parse_query(text: str) -> DeviceSnapshot:
    driver = cuda = None
    gpus: list[Gpu] = []
    section: list[tuple[int, str]] = []  # (indent, title) stack
    cur: Gpu | None = None
    proc: dict[str, str] = {}

    def flush_proc() -> None:
        if cur is not None and _ascii_digits(proc.get("Process ID", "")):
            cur.processes.append(
                GpuProcess(
                    pid=int(proc["Process ID"]),
                    name=proc.get("Name", "?"),
                    used_mib=_mib(proc.get("Used GPU Memory")),
                    gpu=cur.index,
                )
            )
        proc.clear()

    for raw in text.splitlines():
        if not raw.strip() or raw.strip().startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip())
        m = re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$", raw.strip())
        if m and indent == 0:
            flush_proc()
            cur = Gpu(
                index=len(gpus), name="GPU", memory_total_mib=None, memory_used_mib=None, bus_id=m.group(1)
            )
            gpus.append(cur)
            section = []
            continue
        kv = _KV_RE.match(raw)
        while section and section[-1][0] >= indent:
            section.pop()
        if not kv or not kv.group(3):
            section.append((indent, raw.strip().rstrip(":")))
            continue
        key, val = kv.group(2).strip(), kv.group(3)
        where = [s for _i, s in section]
        if cur is None:
            if key == "Driver Version":
                driver = val
            elif key == "CUDA Version":
                cuda = val
            continue
        if key == "Product Name":
            cur.name = val
        elif key == "Minor Number" and _ascii_digits(val):
            cur.index = int(val)
        elif key == "GPU UUID":
            cur.uuid = val
        elif where and where[-1] == "FB Memory Usage":
            if key == "Total":
                cur.memory_total_mib = _mib(val)
                cur.unified = _unreported(val)
            elif key == "Reserved":
                cur.memory_reserved_mib = _mib(val)
            elif key == "Used":
                cur.memory_used_mib = _mib(val)
            elif key == "Free":
                cur.memory_free_mib = _mib(val)
        elif "Processes" in where:
            if key == "Process ID" or (key == "GPU instance ID" and proc.get("Process ID")):
                flush_proc()
            proc[key] = val
    flush_proc()
    if not gpus:
        raise DeviceError("no GPU sections in the nvidia-smi -q output: truncated?")
    for g in gpus:
        g.driver_version = driver
        if g.memory_total_mib is None and not g.unified:
            raise DeviceError(f"GPU {g.index} in the -q output has no FB Memory Usage total: truncated?")
    return DeviceSnapshot(sorted(gpus, key=lambda g: g.index), "query", cuda_version=cuda)


def parse_apps_csv(text: str) -> list[GpuProcess]:
    """--query-compute-apps=gpu_bus_id,pid,process_name,used_memory --format=csv"""
    rows = _csv_rows(text)
    if not rows:
        return []
    head = [_FIELD_ALIASES.get(re.sub(r"\s*\[.*\]$", "", c).strip().lower(), c) for c in rows[0]]
    if "pid" not in head:
        return []
    out = []
    for r in rows[1:]:
        v = dict(zip(head, r, strict=False))
        if _ascii_digits(v.get("pid") or ""):
            out.append(
                GpuProcess(
                    pid=int(v["pid"]),
                    name=v.get("process_name", "?"),
                    used_mib=_mib(v.get("used_memory")),
                    bus_id=v.get("bus_id"),
                )
            )
    return out


# --- CUDA_VISIBLE_DEVICES ---------------------------------------------------------------------


def apply_visible_devices(snap: DeviceSnapshot, cvd: str | None) -> DeviceSnapshot:
    """Narrow the snapshot to what a process with this CUDA_VISIBLE_DEVICES sees."""
    if cvd is None:
        return snap
    wanted = [x.strip() for x in cvd.split(",") if x.strip()]
    kept: list[Gpu] = []
    notes: list[Warning_] = []
    for w in wanted:
        match = None
        if _ascii_digits(w):
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


# --- live query -------------------------------------------------------------------------------


def query_live(timeout: float = 15.0) -> DeviceSnapshot:
    """Run the seed's query (and the processes query) on this machine."""
    if shutil.which("nvidia-smi") is None:
        raise DeviceError(
            "nvidia-smi is not on PATH here. On the GPU machine run:  "
            + " ".join(SEED_QUERY)
            + "  and pass its output: diagnose device FILE (or pipe it in)"
        )
    try:
        p = subprocess.run(SEED_QUERY, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DeviceError(f"nvidia-smi did not answer: {e}") from None
    snap = parse_nvidia_smi(p.stdout + p.stderr)
    try:
        apps = subprocess.run(APPS_QUERY, capture_output=True, text=True, timeout=timeout)
        attach_processes(snap, parse_apps_csv(apps.stdout))
    except (OSError, subprocess.TimeoutExpired):
        pass
    return snap


def attach_processes(snap: DeviceSnapshot, procs: list[GpuProcess]) -> None:
    by_bus = {(g.bus_id or "").lower().lstrip("0"): g for g in snap.gpus}
    for p in procs:
        g = by_bus.get((p.bus_id or "").lower().lstrip("0"))
        if g is not None:
            g.processes.append(p)


def _group_text(members: list[Any]) -> str:
    totals = [g.total_gib for g in members if g.total_gib is not None]
    size = f" {min(totals):.1f} GiB" if totals else ""
    return f"GPU {','.join(str(g.index) for g in members)}: {members[0].name}{size}"
