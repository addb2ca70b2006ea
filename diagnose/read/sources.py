"""Reading logs as streams of complete lines, and splitting the prefixes real logs carry.

Bytes are read in blocks of whole lines so the matcher can prefilter a block at C speed
and only decode the lines that matter; memory stays flat however long the log.
"""

from __future__ import annotations

import os
import re
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..base.errors import InputError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any, BinaryIO

BLOCK_SIZE = 256 << 10  # bigger blocks scan no faster and hold more memory
# The first reads are small and double up to BLOCK_SIZE: a log's opening lines retire most
# engine markers (engine, version, phases reached), so little is searched with all needles.
FIRST_BLOCK = 64 << 10
MAX_LINE = 1 << 20  # a longer line keeps its head and tail, with CUT_MARKER for its middle
HALF_LINE = MAX_LINE // 2
CUT_MARKER = b" [diagnose: the middle of a line over 1 MiB was not read] "


@dataclass(slots=True)
class Source:
    """A log to read: its path (or - for stdin) and the name it is reported under."""

    name: str  # what the report calls it: the path, or "-" for stdin
    path: str | None  # None for stdin


def resolve_sources(paths: list[str]) -> list[Source]:
    """Check every path up front, so a typo fails before any output."""
    if not paths:
        paths = ["-"]
    out: list[Source] = []
    for p in paths:
        if p == "-":
            out.append(Source("-", None))
            continue
        if not os.path.exists(p):
            raise InputError(f"{p}: no such file")
        if os.path.isdir(p):
            raise InputError(f"{p}: is a directory, not a log file")
        if not os.access(p, os.R_OK):
            raise InputError(f"{p}: permission denied")
        out.append(Source(p, p))
    return out


def _open(source: Source) -> BinaryIO:
    if source.path is None:
        if sys.stdin is None:
            raise InputError("no input: stdin is closed")
        return sys.stdin.buffer
    try:
        f = open(source.path, "rb")  # noqa: SIM115 - closed by the caller
    except OSError as e:
        raise InputError(f"{source.name}: cannot read: {e.strerror or e}") from None
    head = f.peek(64)[:64] if hasattr(f, "peek") else b""
    if head[:2] == b"\x1f\x8b":
        return _GunzipStream(f)  # type: ignore[return-value]
    if _is_utf16(head):
        return _Utf16Stream(f)  # type: ignore[return-value]
    return f


def _is_utf16(head: bytes) -> bool:
    """A UTF-16 byte-order mark followed by text whose every other byte is NUL (ASCII in
    UTF-16); stray \\xff\\xfe bytes at the start of a UTF-8 log are not one."""
    if head[:2] == b"\xff\xfe":
        high = head[3::2]  # little-endian: the high bytes follow the low ones
    elif head[:2] == b"\xfe\xff":
        high = head[2::2]
    else:
        return False
    return len(high) >= 2 and high.count(0) * 2 >= len(high)


class _Utf16Stream:
    """A UTF-16 file (what Windows PowerShell 5's `>` writes) as UTF-8 bytes, as it streams."""

    def __init__(self, raw: BinaryIO):
        import codecs

        self._raw = raw
        self._dec = codecs.getincrementaldecoder("utf-16")("replace")

    def read(self, size: int) -> bytes:
        out = b""
        while len(out) < size // 2:
            chunk = self._raw.read(size)
            text = self._dec.decode(chunk, final=not chunk)
            out += text.encode("utf-8")
            if not chunk:
                break
        return out

    def close(self) -> None:
        self._raw.close()


class _GunzipStream:
    """gzip decoded as it streams, giving every byte that decoded before a cut or a corrupt
    spot (gzip.GzipFile drops the last read's output when the stream ends early); then EOFError
    or zlib.error. Concatenated members (logrotate, `cat a.gz b.gz`) are read in turn."""

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._pending = b""
        self._failed: BaseException | None = None
        self._done = False

    def read(self, size: int) -> bytes:
        while len(self._pending) < size and not self._done and self._failed is None:
            chunk = self._raw.read(1 << 16)
            try:
                if not chunk:
                    if not self._d.eof:
                        self._failed = EOFError("compressed file ended before the end-of-stream marker")
                    self._done = True
                    break
                self._pending += self._d.decompress(chunk)
                while self._d.eof and self._d.unused_data:
                    rest = self._d.unused_data  # the next gzip member
                    self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    self._pending += self._d.decompress(rest)
            except zlib.error as e:
                self._failed = e
        if not self._pending and self._failed is not None:
            failed, self._failed = self._failed, None
            self._done = True
            raise failed
        out, self._pending = self._pending[:size], self._pending[size:]
        return out

    def close(self) -> None:
        self._raw.close()


def looks_binary(head: bytes) -> bool:
    """NUL bytes in more than 1 % of the first 8 KiB: an executable, an image, an archive. A
    stray NUL or two (a writer killed mid-line, a block of zeros after a crash) leaves a text
    log a text log."""
    sample = head[:8192]
    return sample.count(b"\x00") > max(1, len(sample) // 100)


def read_blocks(source: Source, block_size: int = BLOCK_SIZE) -> Iterator[bytes]:
    """Yield blocks of complete lines (each ends with \\n, except maybe the very last).

    A line longer than MAX_LINE keeps its first and last MAX_LINE/2 bytes around CUT_MARKER (an
    error is often at the end of a long line); its middle is skipped without being held in
    memory, and a notice on stderr says how many lines were cut. A gzip file cut short gives
    what decoded, with a notice. Reads start at FIRST_BLOCK and double.
    """
    from ..base.errors import say_warning

    f = _open(source)
    corrupt: tuple[type[BaseException], ...] = (EOFError, zlib.error)
    carry = b""
    head = b""  # the start of an over-long line while its middle is skipped
    tail = b""  # its latest bytes
    cut_lines = [0]
    first = True
    total = 0
    size = min(FIRST_BLOCK, block_size)
    try:
        while True:
            try:
                chunk = f.read(size)
                size = min(size * 2, block_size)
            except corrupt as e:
                if total == 0:
                    raise InputError(f"{source.name}: truncated or corrupt gzip data ({e})") from None
                say_warning(
                    f"{source.name}: truncated or corrupt gzip data after {total:,} bytes ({e}); "
                    "diagnosed what decoded"
                )
                break
            except OSError as e:
                raise InputError(f"{source.name}: read error: {e.strerror or e}") from None
            if first:
                first = False
                if chunk.startswith(b"\xef\xbb\xbf"):
                    chunk = chunk[3:]  # a UTF-8 byte-order mark (Windows editors) is not text
                if chunk and looks_binary(chunk):
                    raise InputError(f"{source.name}: binary data, not a text log")
            if not chunk:
                break
            total += len(chunk)
            if head:
                nl = chunk.find(b"\n")
                if nl < 0:
                    tail = (tail + chunk)[-HALF_LINE:]
                    continue
                tail = (tail + chunk[:nl])[-HALF_LINE:]
                yield head + CUT_MARKER + tail + b"\n"
                head = tail = b""
                chunk = chunk[nl + 1 :]
            data = carry + chunk if carry else chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                carry = data
            else:
                carry = data[cut + 1 :]
                yield _cut_long_lines(data[: cut + 1], cut_lines)
            if len(carry) > MAX_LINE:
                head, tail = carry[:HALF_LINE], carry[-HALF_LINE:]
                carry = b""
                cut_lines[0] += 1
        if head:
            yield head + CUT_MARKER + tail
        elif carry:
            yield _cut_long_lines(carry, cut_lines)
    finally:
        if source.path is not None:
            f.close()
    if total == 0:
        raise InputError(f"{source.name}: empty input")
    if cut_lines[0]:
        say_warning(
            f"{source.name}: {cut_lines[0]} line(s) over 1 MiB were cut to their first and last "
            f"{HALF_LINE >> 10} KiB; the middle was not read"
        )


def _cut_long_lines(block: bytes, counter: list[int] | None = None) -> bytes:
    """Cut lines longer than MAX_LINE inside a block to their head and tail (rare: checked
    with a few find calls)."""
    n = len(block)
    if n <= MAX_LINE:
        return block
    half = MAX_LINE // 2
    pos = 0
    # If every window of half a line holds a newline, no line can exceed MAX_LINE.
    while pos + half < n:
        if block.find(b"\n", pos, pos + half) < 0:
            break
        pos += half
    else:
        return block
    out: list[bytes] = []
    start = 0
    while start < n:
        nl = block.find(b"\n", start)
        end = n if nl < 0 else nl + 1
        if end - start > MAX_LINE + 1:
            stop = end - 1 if nl >= 0 else end
            out.append(block[start : start + HALF_LINE] + CUT_MARKER + block[stop - HALF_LINE : end])
            if counter is not None:
                counter[0] += 1
        else:
            out.append(block[start:end])
        start = end
    return b"".join(out)


# --- decoding -------------------------------------------------------------------------

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def decode(raw: bytes) -> tuple[str, bool]:
    """Bytes of one line -> text without ANSI codes or line ending; (text, was_cut)."""
    truncated = len(raw) > HALF_LINE and CUT_MARKER in raw
    text = raw.decode("utf-8", "replace")
    text = text.rstrip("\r\n")
    if text[:1] == "{" and text.endswith("}"):
        inner = unwrap_json(text)
        if inner is not None:
            text = inner
    if "\x1b" in text:
        text = ANSI_RE.sub("", text)
    if "\r" in text:
        # tqdm redraws with \r: the terminal shows the last non-empty segment.
        parts = [p for p in text.split("\r") if p.strip()]
        text = parts[-1] if parts else ""
    return text, truncated


# A log line as a JSON record: a container runtime's file ({"log": …, "time": …}: Docker's
# json-file, Fluentd/Loki exports), a cloud logger ({"textPayload": …}, {"jsonPayload": {"message": …}}),
# `journalctl -o json` ({"MESSAGE": …}), or the engine's own structured output (TGI's
# --json-output: Rust tracing's {"timestamp", "level", "target", "fields"/"message", "spans"}).
_MESSAGE_KEYS = ("log", "message", "msg", "MESSAGE", "textPayload", "line")
_TIME_KEYS = ("time", "timestamp", "@timestamp", "ts")
_LEVEL_KEYS = ("level", "severity", "levelname", "lvl")


def unwrap_json(text: str) -> str | None:
    """The line a JSON log record holds, rebuilt as its text form would print it (the record's
    time and level first, so the usual prefix layers read them); None when it is not one. One
    line: a newline in any field (the message, but also a time or a span name) reads " ⏎ "."""
    import json  # only lines that look like JSON records pay for it

    try:
        obj = json.loads(text)
    except ValueError:
        return None
    line = _record_line(obj)
    return None if line is None else line.replace("\n", " ⏎ ")


def _record_line(obj: Any) -> str | None:
    if not isinstance(obj, dict) or "function" in obj:
        # llama.cpp's own JSON lines (Ollama's runner: {"function", "level", "msg", …}) are
        # read as they are: the rules and markers for them know that shape
        return None
    fields = obj.get("fields") if isinstance(obj.get("fields"), dict) else {}
    msg = fields.get("message") if isinstance(fields.get("message"), str) else None
    key = "fields"
    if msg is None:
        for key in _MESSAGE_KEYS:
            if isinstance(obj.get(key), str):
                msg = obj[key]
                break
        else:
            payload = obj.get("jsonPayload")
            if isinstance(payload, dict) and isinstance(payload.get("message"), str):
                msg, key = payload["message"], "jsonPayload"
    if msg is None:
        return None
    msg = msg.rstrip("\r\n")
    when = next((obj[k] for k in _TIME_KEYS if isinstance(obj.get(k), str)), None)
    if when is None and str(obj.get("__REALTIME_TIMESTAMP", "")).isdigit():
        from datetime import UTC, datetime  # journalctl -o json: microseconds since 1970

        us = int(obj["__REALTIME_TIMESTAMP"])
        when = datetime.fromtimestamp(us / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    level = next((obj[k] for k in _LEVEL_KEYS if isinstance(obj.get(k), str)), None)
    if isinstance(obj.get("target"), str):  # Rust tracing (TGI): "TIME  LEVEL span: target: message k=v"
        spans = obj.get("spans") if isinstance(obj.get("spans"), list) else []
        names = "".join(
            f"{s['name']}: " for s in spans if isinstance(s, dict) and isinstance(s.get("name"), str)
        )
        extra = "".join(f" {k}={v}" for k, v in fields.items() if k != "message")
        return f"{when or ''}  {(level or 'INFO').upper()} {names}{obj['target']}: {msg}{extra}".lstrip()
    if key == "log":  # a container runtime's record: its time, then the program's own line
        return f"{when} {msg}" if when else msg
    head = " ".join(x for x in (when, level.upper() if level else None) if x)
    return f"{head} {msg}" if head else msg


def interleaved_blocks(
    sources: list[Source], clock: Callable[[str, bytes], float | None]
) -> Iterator[tuple[str, bytes]]:
    """The lines of several logs of one run (nodes, ranks) in the order their timestamps
    give, as (source name, run of consecutive lines from it). A line without its own time
    keeps its place after the line before it in its file; a file whose lines carry no time
    at all comes after the others. Streams: one pending line per file is held. `clock` reads
    a line's time (source name, its first bytes) as seconds, None when it prints none."""
    import heapq

    def lines_of(i: int, src: Source) -> Iterator[tuple[float, int, int, bytes]]:
        last = float("inf")
        n = 0
        for block in read_blocks(src):
            for raw in block.splitlines(keepends=True):
                n += 1
                t = clock(src.name, raw[:300].rstrip(b"\r\n"))
                if t is not None:
                    last = t
                yield (last, i, n, raw if raw.endswith(b"\n") else raw + b"\n")

    merged = heapq.merge(*(lines_of(i, s) for i, s in enumerate(sources)))
    run: list[bytes] = []
    current = -1
    for _t, i, _n, raw in merged:
        if i != current and run:
            yield sources[current].name, b"".join(run)
            run = []
        current = i
        run.append(raw)
        if len(run) >= 4096:
            yield sources[current].name, b"".join(run)
            run = []
    if run:
        yield sources[current].name, b"".join(run)
