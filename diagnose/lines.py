"""Reading logs as streams of complete lines, and splitting the prefixes real logs carry.

Bytes are read in blocks of whole lines so the matcher can prefilter a block at C speed
and only decode the lines that matter; memory stays flat however long the log.
"""

from __future__ import annotations

import os
import re
import sys
import zlib
from collections.abc import Iterator

from .errors import InputError
from .model import Line
from .records import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import BinaryIO

BLOCK_SIZE = 256 << 10  # bigger blocks scan no faster and hold more memory
# The first reads are small and double up to BLOCK_SIZE: a log's opening lines retire most
# engine markers (engine, version, phases reached), so little is searched with all needles.
FIRST_BLOCK = 64 << 10
MAX_LINE = 1 << 20  # a longer line keeps its head and tail, with CUT_MARKER for its middle
HALF_LINE = MAX_LINE // 2
CUT_MARKER = b" [diagnose: the middle of a line over 1 MiB was not read] "


@record
class Source:
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


def _looks_binary(head: bytes) -> bool:
    # Like grep: NUL bytes mean binary. Text logs never carry them.
    return b"\x00" in head[:8192]


def read_blocks(source: Source, block_size: int = BLOCK_SIZE) -> Iterator[bytes]:
    """Yield blocks of complete lines (each ends with \\n, except maybe the very last).

    A line longer than MAX_LINE keeps its first and last MAX_LINE/2 bytes around CUT_MARKER (an
    error is often at the end of a long line); its middle is skipped without being held in
    memory, and a notice on stderr says how many lines were cut. A gzip file cut short gives
    what decoded, with a notice. Reads start at FIRST_BLOCK and double.
    """
    from .errors import say_warning

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
                if chunk and _looks_binary(chunk):
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
    time and level first, so the usual prefix layers read them); None when it is not one."""
    import json  # only lines that look like JSON records pay for it

    try:
        obj = json.loads(text)
    except ValueError:
        return None
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
    msg = msg.rstrip("\r\n").replace("\n", " ⏎ ")
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


# --- prefix splitting -----------------------------------------------------------------

_LEVELS = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL|TRACE)"
_LEVEL_NORMAL = {
    "WARN": "WARNING",
    "FATAL": "CRITICAL",
    "E": "ERROR",
    "W": "WARNING",
    "I": "INFO",
    "F": "CRITICAL",
    "TRACE": "DEBUG",
    "D": "DEBUG",
    "T": "DEBUG",
    "V": "DEBUG",
}

# Each prefix pattern is anchored and consumes one layer; the splitter loops over them so
# stacked prefixes (docker timestamp + process + level) come off in any order. The layers
# every engine's logs can carry are here; each engine's own line layout is data, in its
# profile's `prefixes` (rules/engines/*.yaml), registered between the two lists when the
# profiles load. Named groups: ts, level (a word) or lv1 (a letter), pid, proc, rank, loc,
# tags (a process tag whose number is the rank), spans (tracing spans, rank=N at their end).
_HEAD: list[re.Pattern[str]] = [
    # k9s / box-drawing borders, markdown quotes, CI pipes
    re.compile(r"(?P<wrap>[│┃|]\s|>\s?|\s+\|\s)"),
    # docker compose: "vllm  | " (service name, not a level word)
    re.compile(r"(?P<wrap>(?!" + _LEVELS + r"\b)[A-Za-z0-9][\w.-]*(?:-\d+)?\s+\|\s)"),
    # kubectl logs --prefix: "[pod/vllm-7d9f8c-abcde/vllm] "
    re.compile(r"(?P<wrap>\[pod/[^\]/\s]+/[^\]\s]+\]\s)"),
    # cat -n / nl: the line number and a tab
    re.compile(r"(?P<wrap>\s*\d+\t)"),
    # Ray core: [2025-05-26 18:58:10,599 E 629624 629624] logging.cc:496:
    re.compile(
        r"\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}[.,]\d+) (?P<lv1>[IWEF]) (?P<pid>\d+) \d+\]\s+"
        r"(?P<loc>[\w./-]+:\d+):\s?"
    ),
]
# after the engines' own layouts: a bracketed engine stamp ("[2025-01-23 19:35:20 TP0]") is
# the engine's, not a bare timestamp
_MID: list[re.Pattern[str]] = [
    # (journald first: its short-iso form starts with the same time as a bare RFC 3339 stamp)
    # journald: "Feb 03 10:11:12 host ollama[1234]: ", and -o short-iso's ISO time
    re.compile(
        r"(?:[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}|(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?))"
        r" \S+ (?P<proc>[\w.@-]+)\[(?P<pid>\d+)\]:\s"
    ),
    # Kubernetes CRI log files (containerd, CRI-O: /var/log/containers/*.log): time, stream, P/F
    re.compile(
        r"(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})) (?:stdout|stderr) [PF] "
    ),
    # RFC 3339 / ISO 8601 in front (docker --timestamps, kubectl, TGI, buildkite in brackets, LMDeploy's " - ")
    re.compile(
        r"\[?(?P<ts>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\]?"
        r"(?:\s+-\s+|\s*\|\s*|\s+)"
    ),
]
_TAIL: list[re.Pattern[str]] = [
    # a process in parentheses: (VllmWorker rank=3 pid=1090) (EngineCore_0 pid=5839), Ray's (pid=12, ip=…)
    re.compile(r"\((?P<proc>[A-Za-z_][^()]*?)?,?\s?pid=(?P<pid>\d+)(?:,\s*ip=[^)]*)?\)\s?"),
    # torch distributed: [rank0]:
    re.compile(r"\[rank(?P<rank>\d+)\]:\s?"),
    # glog (torch C++, Ray, Mooncake): W0803 21:48:43.773000 6890 torch/_inductor/utils.py:1731]
    re.compile(r"(?P<lv1>[IWEF])\d{4} \d{2}:\d{2}:\d{2}\.\d+\s+(?P<pid>\d+)\s+(?P<loc>[^\]\s]+:\d+)\]\s?"),
    # uvicorn: "INFO:     " ; loguru / logging: "INFO | ", "| INFO     | ", "- ERROR - "
    re.compile(r"(?P<level>" + _LEVELS + r"):\s+"),
    re.compile(
        r"(?:[\w.]+\s+-\s+)?(?P<level>" + _LEVELS + r")\s*(?:\||-)\s+"
        r"(?:\[pid=\d+ ppid=\d+\] - )?(?:(?P<loc>[\w./-]+\.py:\d+) - )?"
    ),
    # Python logging after a timestamp: "INFO worker.py:1888 -- " (Ray) or bare "ERROR "
    re.compile(r"(?P<level>" + _LEVELS + r")\s+(?:(?P<loc>[\w./-]+\.py:\d+)\s+--\s+)?"),
]
_BARE_LEVEL = _TAIL[-1]  # a bare level word: a prefix only when something else told us it is one
PREFIX_GROUPS = frozenset(
    {"ts", "level", "lv1", "pid", "proc", "rank", "loc", "loc2", "tags", "spans", "wrap"}
)
_ENGINE_PREFIXES: dict[str, list[re.Pattern[str]]] = {}
_PREFIXES: list[re.Pattern[str]] = _HEAD + _MID + _TAIL
_ENGINES_LOADED = False
_LOADING = False


def set_engine_prefixes(engine: str, patterns: list[re.Pattern[str]]) -> None:
    """An engine profile's line layouts (rules/engines/*.yaml `prefixes`), tried between the
    layers every log can carry and the generic level words."""
    global _PREFIXES, _ENGINES_LOADED
    _ENGINE_PREFIXES[engine] = patterns
    _PREFIXES = _HEAD + [p for e in sorted(_ENGINE_PREFIXES) for p in _ENGINE_PREFIXES[e]] + _MID + _TAIL
    _ENGINES_LOADED = True


def _load_engine_prefixes() -> None:
    """Lines split before any Knowledge was loaded (tools, tests): the shipped profiles' layouts."""
    global _LOADING
    if _LOADING:
        return
    _LOADING = True
    try:
        from .engines import load_profiles

        load_profiles()
    finally:
        _LOADING = False


_RANK_IN_PROC = re.compile(r"(?:rank=|TP|_TP|Worker_TP|rank)(\d+)")
_TGI_RANK = re.compile(r"\srank=(\d+)\s*$")
_SGLANG_TP = re.compile(r"TP(\d+)")


def split_prefixes(line: Line) -> Line:
    """Fill level/timestamp/process/rank/location/message from line.text."""
    if not _ENGINES_LOADED:
        _load_engine_prefixes()
    s = line.text
    if s.startswith(("│", "┃")):
        s = s.rstrip()
        if s.endswith(("│", "┃")):
            s = s[:-1].rstrip()
    learned = _LEARNED.get(line.source)
    if learned and s.startswith(learned):
        s = s[len(learned) :]  # a wrapper this source's other lines showed (below)
    rest = _peel(line, s)
    if rest is s and s and not s[0].isspace():
        # no layer known at the start: a wrapper we do not know (a custom logger, `kubectl
        # logs --prefix`, `cat -n`) may sit in front of a layout we do; take it only when
        # what follows reads as a whole engine prefix (a level and a time or a process)
        for m in _LAYOUT_START.finditer(s, 1, min(len(s), 160)):
            if s[m.start() - 1] not in _WRAPPER_ENDS:
                continue
            trial = Line(source=line.source, number=line.number, text=line.text)
            after = _peel(trial, s[m.start() :])
            if trial.level and (trial.timestamp or trial.process):
                for k in ("level", "timestamp", "pid", "process", "rank", "location"):
                    setattr(line, k, getattr(trial, k))
                rest = after
                if len(_LEARNED) < 64:
                    # the same text in front of this source's other lines (tracebacks, bare
                    # messages) is that wrapper too
                    _LEARNED[line.source] = s[: m.start()]
                break
    line.message = rest
    return line


# where an engine's layout may begin after an unknown wrapper: a process tag, a bracketed or
# ISO date, a level word; the character before it must end a wrapper
_LAYOUT_START = re.compile(
    r"\(\w[\w-]*(?: pid=\d+)?\)|\[\d{4}-\d\d-\d\d|\d{4}-\d\d-\d\dT\d|\b(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b"
)
_WRAPPER_ENDS = frozenset(" \t]|:>")
_LEARNED: dict[str, str] = {}  # source -> an unknown wrapper peeled from its lines


def forget_wrappers() -> None:
    """A new scan learns its sources' wrappers afresh (a path read before may hold another log)."""
    _LEARNED.clear()


def _peel(line: Line, s: str) -> str:
    """Peel the known prefix layers off s into the line's fields; the rest (s itself when
    none matched)."""
    level_seen = False
    for _ in range(10):
        for pat in _PREFIXES:
            m = pat.match(s)
            if not m or m.end() == 0:
                continue
            g = m.groupdict()
            # A bare level word is only a prefix when nothing else told us the level.
            if pat is _BARE_LEVEL and (level_seen or not (line.timestamp or line.process)):
                continue
            lv = g.get("level") or g.get("lv1")
            if lv:
                if not line.level:
                    line.level = _LEVEL_NORMAL.get(lv, lv)
                level_seen = True
            ts = g.get("ts")
            if ts and not line.timestamp:
                line.timestamp = ts
            proc = g.get("proc")
            if g.get("pid"):  # the innermost layer's: the engine's own process, not a wrapper's
                line.pid = int(g["pid"])
                if proc:
                    line.process = proc.strip().rstrip(",")
                    r = _RANK_IN_PROC.search(proc)
                    if r and line.rank is None:
                        line.rank = int(r.group(1))
            tags = g.get("tags")
            if tags:
                line.process = tags.strip()
                r = _SGLANG_TP.search(tags)
                if r and line.rank is None:
                    line.rank = int(r.group(1))
            if g.get("rank") and line.rank is None:
                line.rank = int(g["rank"])
            loc = g.get("loc") or g.get("loc2")
            if loc and not line.location:
                line.location = loc
            if g.get("spans"):
                r = _TGI_RANK.search(s)
                if r and line.rank is None:
                    line.rank = int(r.group(1))
            s = s[m.end() :]
            break
        else:
            break
    return s


def make_line(source: str, number: int, raw: bytes) -> Line:
    text, truncated = decode(raw)
    line = Line(source=source, number=number, text=text, truncated=truncated)
    return split_prefixes(line)


def iter_lines(source: Source) -> Iterator[Line]:
    """Every line of a source, decoded and split (for tools that need them all)."""
    number = 0
    for block in read_blocks(source):
        if block.endswith(b"\n"):
            block = block[:-1]
        for raw in block.split(b"\n"):
            number += 1
            yield make_line(source.name, number, raw)


def interleaved_blocks(sources: list[Source]) -> Iterator[tuple[str, bytes]]:
    """The lines of several logs of one run (nodes, ranks) in the order their timestamps
    give, as (source name, run of consecutive lines from it). A line without its own time
    keeps its place after the line before it in its file; a file whose lines carry no time
    at all comes after the others. Streams: one pending line per file is held."""
    import heapq

    from .triage import seconds  # the log clock (only a merged scan needs it)

    def lines_of(i: int, src: Source) -> Iterator[tuple[float, int, int, bytes]]:
        last = float("inf")
        n = 0
        for block in read_blocks(src):
            for raw in block.splitlines(keepends=True):
                n += 1
                ts = make_line(src.name, n, raw[:300].rstrip(b"\r\n")).timestamp
                t = seconds(ts)
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
