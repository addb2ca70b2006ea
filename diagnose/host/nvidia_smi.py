"""nvidia-smi's outputs into one `DeviceSnapshot`: the query CSV (with or without units and
headers), the default table, `-q`, `-L`, the compute-apps CSV; a live run of it.

The seeds start every deployment by pinning down the GPUs: how many are visible, how much
memory each has and uses, whether the drivers agree. People paste any of these formats.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess

import pyparsing as pp

from .gpus import (
    APPS_QUERY,
    NO_DEVICES,
    NO_DRIVER,
    SEED_QUERY,
    DeviceError,
    DeviceSnapshot,
    Gpu,
    GpuProcess,
    Warning_,
    ascii_digits,
)

_MIB_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(MiB|GiB|MB|GB|KiB)?\s*$", re.I)


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
    if any(h in _FIELD_ALIASES for h in head) and not ascii_digits(rows[0][0].strip()):
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
                index=int(idx) if idx and ascii_digits(idx) else n,
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
        if ascii_digits(c) and "index" not in out:
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
        if cur is not None and ascii_digits(proc.get("Process ID", "")):
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
        elif key == "Minor Number" and ascii_digits(val):
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
        if ascii_digits(v.get("pid") or ""):
            out.append(
                GpuProcess(
                    pid=int(v["pid"]),
                    name=v.get("process_name", "?"),
                    used_mib=_mib(v.get("used_memory")),
                    bus_id=v.get("bus_id"),
                )
            )
    return out


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
