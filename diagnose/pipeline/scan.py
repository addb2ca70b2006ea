"""A scan end to end: sources → lines → matcher (scan_sources) → the stages of a diagnosis
(stages.py) → Diagnosis; and the GPU snapshot the user gives with --gpus."""

from __future__ import annotations

from collections.abc import Iterable

from ..base.errors import InputError
from ..knowledge.loaded import Knowledge
from ..match.scanner import Scanner, ScanResult
from ..model.records import Diagnosis
from ..read.clock import seconds
from ..read.sources import Source, interleaved_blocks, read_blocks, resolve_sources
from .stages import diagnose

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:  # imported where used: a plain scan needs neither pyparsing's device grammar nor the budget
    from ..host.gpus import DeviceError, DeviceSnapshot


def scan_sources(
    sources: Iterable[Source],
    know: Knowledge,
    engine: str | None = None,
    keep_rule_lines: bool = False,
    interleave: bool = False,
) -> ScanResult:
    """One scan over the sources: one after the other, or (`interleave`, the logs of one run)
    line by line in the order of their timestamps."""
    scanner = Scanner(know.rules, know.profiles, engine=engine, keep_rule_lines=keep_rule_lines)
    if interleave:
        layout = know.profiles.layout.fresh()

        def clock(name: str, head: bytes) -> float | None:
            return seconds(layout.line(name, 0, head).timestamp)

        for name, block in interleaved_blocks(list(sources), clock):
            scanner.set_source(name)
            scanner.feed(block)
        return scanner.finish()
    for src in sources:
        scanner.set_source(src.name)
        for block in read_blocks(src):
            scanner.feed(block)
    return scanner.finish()


def load_snapshot(path: str) -> tuple[DeviceSnapshot | None, DeviceError | None]:
    """Read `--gpus FILE` (or `--gpus 2x80`, two GPUs of 80 GiB): a snapshot, or the driver
    error it reports; other problems raise."""
    import os

    from ..host.gpus import DeviceError, DeviceSnapshot, Gpu
    from ..host.nvidia_smi import parse_nvidia_smi

    if not os.path.exists(path):
        from ..budget.config import parse_gpus_spec

        given = parse_gpus_spec(path)
        if given is not None:
            n, gib = given
            gpus = [
                Gpu(index=i, name="(given)", memory_total_mib=int(gib * 1024), memory_used_mib=None)
                for i in range(n)
            ]
            return DeviceSnapshot(gpus=gpus, source="given"), None

    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(4 << 20)  # nvidia-smi output is small; a huge file is not one
    except OSError as e:
        raise InputError(f"{path}: cannot read the GPU snapshot: {e.strerror or e}") from None
    try:
        return parse_nvidia_smi(text), None
    except DeviceError as e:
        if e.driver:
            return None, e
        raise DeviceError(f"{path}: {e}") from None


def scan_paths(
    paths: list[str],
    know: Knowledge | None = None,
    engine: str | None = None,
    gpus: str | None = None,
    config: str | None = None,
    show_secrets: bool = False,
) -> Diagnosis:
    """One diagnosis of these paths read as one log (several: the logs of one run, interleaved
    by their timestamps)."""
    know = know or Knowledge.load()
    sources = resolve_sources(paths)
    snapshot, snap_err = load_snapshot(gpus) if gpus else (None, None)
    result = scan_sources(sources, know, engine, interleave=len(sources) > 1)
    name = ", ".join(s.name for s in sources)
    shape = None
    if config:
        from ..budget.architecture import shape_from_config
        from ..budget.config import load_config

        shape = shape_from_config(load_config(config))
    return diagnose(result, know, name, engine, snapshot, snap_err, shape=shape, show_secrets=show_secrets)
