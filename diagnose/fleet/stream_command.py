"""`diagnose stream`: log records of many sources in (a pipeline's JSON lines, CRI lines or
text), one JSON verdict line out per change of each source (schema `diagnose.stream/1`).

A reader thread puts input lines on a bounded queue: when the scan falls behind, reading
stops (back-pressure on the pipe) instead of memory growing; while input is quiet the main
loop still ticks each second, so a failure whose cause never comes and a stuck phase are
reported without waiting for more input.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from ..base.errors import InputError, say_warning
from ..stream.session import SCHEMA, Event, Sessions
from .node_agent import NodeAgent
from .record_shapes import Record, RecordReader
from .scope import Scope

QUEUE_BATCHES = 64  # batches of input lines read ahead of the scan, at most
MAX_INPUT_LINE = 1 << 20  # a longer input line keeps its head
TICK_S = 1.0
# A source still writing has its lines read a block (32 KiB) at a time, or once they are this
# old; one that goes quiet (a server that died) is read at the next tick.
BUSY_HOLD_S = 10.0
EXAMPLES_KEPT = 5  # sources named per summary group
_END = object()


READ_SIZE = 1 << 16


def _batches(f: IO[bytes]) -> Iterator[list[bytes]]:
    """The input's lines, a batch for each read: what a pipe has given so far, or 64 KiB of a
    file (a queue operation a line cost more than parsing the line). A line longer than
    MAX_INPUT_LINE keeps its head; the rest is dropped unread into memory."""
    fd = f.fileno()
    head = b""  # the start of a line not yet ended
    skipping = False  # the rest of an over-long line is being dropped
    while True:
        data = os.read(fd, READ_SIZE)
        if not data:
            break
        pieces = data.split(b"\n")
        if len(pieces) == 1:  # no line ends in this read
            if not skipping:
                head += data
                if len(head) >= MAX_INPUT_LINE:
                    head, skipping = head[:MAX_INPUT_LINE], True
            continue
        out = [(head if skipping else head + pieces[0])[:MAX_INPUT_LINE]]
        out += [p[:MAX_INPUT_LINE] for p in pieces[1:-1]]
        head, skipping = pieces[-1], False
        if len(head) >= MAX_INPUT_LINE:
            head, skipping = head[:MAX_INPUT_LINE], True
        yield out
    if head:
        yield [head]


def _open_inputs(paths: list[str]) -> list[tuple[str, IO[bytes]]]:
    out: list[tuple[str, IO[bytes]]] = []
    for p in paths or ["-"]:
        if p == "-":
            out.append(("-", sys.stdin.buffer))
            continue
        try:
            out.append((p, open(p, "rb")))  # noqa: SIM115 - closed by the reader thread
        except IsADirectoryError:
            raise InputError(f"{p}: is a directory, not a file of records") from None
        except OSError as e:
            raise InputError(f"{p}: cannot read: {e.strerror or e}") from None
    return out


@dataclass(slots=True)
class Batch:
    """Input lines as read, and the input they came from (a file's path, `-`)."""

    name: str
    lines: list[bytes]


def _reader(inputs: list[tuple[str, IO[bytes]]], q: queue.Queue[Any]) -> None:
    try:
        for name, f in inputs:
            with f if f is not sys.stdin.buffer else contextlib.nullcontext(f):  # stdin stays open
                for batch in _batches(f):
                    q.put(Batch(name, batch))  # blocks when the scan is behind: back-pressure
    except OSError as e:
        q.put(InputError(f"cannot read the input: {e.strerror or e}"))
    finally:
        q.put(_END)


class Summary:
    """Final verdicts rolled up by class × model × node (bounded: counts and a few names)."""

    def __init__(self) -> None:
        self.groups: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.sources = 0

    def take(self, e: Event) -> None:
        self.sources += 1
        d = e.diagnosis
        model = str((d.launch.get("model") if d is not None else None) or "")
        cls = (e.finding or {}).get("class") or ""
        key = (e.status, cls, model, e.labels.get("node", ""))
        g = self.groups.setdefault(key, {"sources": 0, "examples": []})
        g["sources"] += 1
        if len(g["examples"]) < EXAMPLES_KEPT:
            g["examples"].append(e.source)

    def to_json(self) -> dict[str, Any]:
        groups = [
            {"status": s, "class": c or None, "model": m or None, "node": n or None, **g}
            for (s, c, m, n), g in sorted(self.groups.items(), key=lambda kv: -kv[1]["sources"])
        ]
        return {"schema": SCHEMA, "event": "summary", "sources": self.sources, "groups": groups}


@dataclass
class Output:
    """Where verdicts go: JSON lines (only the kinds asked for), the sinks, the summary."""

    only: set[str] | None = None
    summary: bool = False
    out: IO[str] | None = None
    sinks: Iterable[Callable[[Event, int], None]] = ()
    scope: Scope | None = None  # --include / --exclude
    stop: threading.Event | None = None  # set by SIGTERM: the verdicts held are flushed, then the end


def run_stream(
    inputs: list[str],
    sessions: Sessions,
    key: str | list[str] | None = None,
    text_source: str | None = None,
    output: Output | None = None,
) -> int:
    """Read every input to its end; exit code 1 when a source failed, else 0."""
    q: queue.Queue[Any] = queue.Queue(maxsize=QUEUE_BATCHES)
    threading.Thread(target=_reader, args=(_open_inputs(inputs), q), daemon=True).start()
    return consume(q, sessions, RecordReader(key, text_source), output or Output())


def run_agent(
    agent: NodeAgent, sessions: Sessions, output: Output, poll_s: float, timeout: float | None
) -> int:
    """The node agent: poll the files, feed their records; until `timeout` (None: for ever)."""
    q: queue.Queue[Any] = queue.Queue(maxsize=QUEUE_BATCHES)

    def produce() -> None:
        ends = None if timeout is None else time.monotonic() + timeout
        try:
            while ends is None or time.monotonic() < ends:
                for rec in agent.poll():
                    q.put(rec)  # blocks when the scan is behind: the files wait, not memory
                while agent.closed_sources:
                    q.put(("close", agent.closed_sources.pop(0)))
                while agent.problems:
                    q.put(("warn", agent.problems.pop(0)))
                time.sleep(poll_s)
        finally:
            agent.close()
            q.put(_END)

    threading.Thread(target=produce, daemon=True).start()
    return consume(q, sessions, RecordReader(), output)


def consume(q: queue.Queue[Any], sessions: Sessions, reader: RecordReader, output: Output) -> int:
    """The main loop: records in, events out; a tick a second whether input comes or not.
    Queue items: a Batch of input lines, a Record, ("close", source), ("warn", text), an
    InputError, _END."""
    out = output.out or sys.stdout
    only = output.only
    sinks = list(output.sinks)
    failed: set[str] = set()
    roll = Summary()

    def emit(events: list[Event]) -> None:
        for e in events:
            for sink in sinks:
                sink(e, len(sessions))
            if e.status == "failed" and e.kind in ("failed", "closed", "finding"):
                failed.add(e.source)
            if e.kind == "closed":
                roll.take(e)
            if only is None or e.kind in only:
                out.write(json.dumps(e.to_json(), ensure_ascii=False) + "\n")
        if events:
            out.flush()

    last_tick = time.monotonic()
    stop = output.stop
    while stop is None or not stop.is_set():
        try:
            item = q.get(timeout=TICK_S)
        except queue.Empty:
            item = None
        now = time.monotonic()
        if now - last_tick >= TICK_S:  # quiet or not, time passes for every source
            last_tick = now
            emit(sessions.tick())
        if item is None:
            continue
        if item is _END:
            break
        if isinstance(item, InputError):
            raise item
        if isinstance(item, tuple):
            if item[0] == "warn":
                say_warning(item[1])
            else:  # the node agent: the source's file was removed
                emit(sessions.close(item[1], gone=True))
            continue
        if isinstance(item, Record):
            records: Iterable[Record] = [reader.joined(item)]
        else:
            name = item.name
            records = (rec for raw in item.lines for rec in reader.read(raw.decode("utf-8", "replace"), name))
        feed = sessions.feed_line
        scope = output.scope if output.scope is not None and not output.scope.everything else None
        for rec in records:
            if scope is not None and not scope.follows(rec.source, rec.labels):
                continue
            for line in rec.lines:
                events = feed(rec.source, line, rec.labels, rec.time)
                if events:
                    emit(events)
    emit(sessions.close_all())
    if output.summary:
        out.write(json.dumps(roll.to_json(), ensure_ascii=False) + "\n")
        out.flush()
    return 1 if failed else 0
