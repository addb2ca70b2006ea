"""A log line's prefix layers: timestamps, levels, processes, ranks and locations peeled off
its text into the line's fields, leaving the message.

The layers every log can carry are here; each engine's own line layout is data, in its
profile's `prefixes` (rules/engines/*.yaml), and reaches a `Layout` when the profiles load
(`engines.Profiles.layout`). A scan takes a `fresh()` copy: the wrappers it learns from its
sources' lines are its own, not shared with another scan or stream.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from ..base.bounded import kept
from ..model.records import Line
from ..search.pattern_tree import ZERO_DIGITS, can_start_with, digit_blind
from .sources import Source, decode, read_blocks

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

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
# stacked prefixes (docker timestamp + process + level) come off in any order. Named groups: ts, level (a word) or lv1 (a letter), pid, proc, rank, loc,
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

_RANK_IN_PROC = re.compile(r"(?:rank=|TP|_TP|Worker_TP|rank)(\d+)")
_TGI_RANK = re.compile(r"\srank=(\d+)\s*$")
_SGLANG_TP = re.compile(r"TP(\d+)")


# where an engine's layout may begin after an unknown wrapper: a process tag, a bracketed or
# ISO date, a level word (at a word's start); the character before it must end a wrapper.
# Written so that `re` skips to the characters a match can begin with (the lookahead): a line
# no layer starts is searched in 3.5 us, not 5.5 (tests/test_literals.py holds it equal to the
# plain alternation `\(…\)|\[date|date|\b(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b`)
_LAYOUT_START = re.compile(
    r"(?=[(\[\dDIWEC])(?:\(\w[\w-]*(?: pid=\d+)?\)|\[\d{4}-\d\d-\d\d|\d{4}-\d\d-\d\dT\d"
    r"|(?:D(?<!\wD)EBUG|I(?<!\wI)NFO|W(?<!\wW)ARN(?:ING)?|E(?<!\wE)RROR|C(?<!\wC)RITICAL)\b)"
)
_WRAPPER_ENDS = frozenset(" \t]|:>")
_HELPERS = (_RANK_IN_PROC, _TGI_RANK, _SGLANG_TP, _LAYOUT_START)  # read on the way, digit-blind too
# characters of the longest line whose plan is kept (a longer one rarely repeats); plans are
# kept from DISPATCH_AFTER lines split on (reading the layers' parse trees costs a short log ~3 ms)
PLAN_MAX = 512
PLANS_KEPT = 4096  # plans kept per set of layers (at most ~2 MiB)
DISPATCH_AFTER = 200  # lines split before layers are chosen by first character (a short log
# would spend more working out the choice than it saves)


class Layout:
    """The prefix layers of the logs one scan reads, and the unknown wrappers it learned."""

    __slots__ = ("_blind", "_by_first", "_learned", "_plans", "_splits", "prefixes")

    def __init__(self, engine_prefixes: Sequence[re.Pattern[str]] = ()) -> None:
        # the engines' own layouts sit between the layers every log can carry and the
        # generic level words (a bracketed engine stamp is the engine's, not a bare time)
        self.prefixes: list[re.Pattern[str]] = [*_HEAD, *engine_prefixes, *_MID, *_TAIL]
        self._learned: dict[str, str] = {}  # source -> an unknown wrapper peeled from its lines
        # first character -> the layers that can begin with it, in order (shared by fresh copies:
        # it depends on the layers alone)
        self._by_first: dict[str, list[re.Pattern[str]]] = {}
        self._splits = [0]  # lines split by this layout and its copies (a call over many small logs)
        # a line's shape (its bytes with digits zeroed) -> how it splits (see split), shared by
        # fresh copies; and whether every layer is blind to which digit it reads (None: not
        # asked yet), without which no plan is kept
        self._plans: dict[tuple[str | None, bytes], tuple[tuple[Any, ...], ...]] = {}
        self._blind: list[bool | None] = [None]

    def fresh(self) -> Layout:
        """The same layers with nothing learned: one per scan or stream."""
        out = Layout.__new__(Layout)
        out.prefixes = self.prefixes
        out._learned = {}
        out._by_first = self._by_first
        out._splits = self._splits
        out._plans = self._plans
        out._blind = self._blind
        return out

    def _layers(self, s: str) -> Sequence[re.Pattern[str]]:
        """The layers worth trying at the start of s: after a few hundred lines, only those
        that can begin with its first character (each layer tries ~1 µs; a line tried ~39)."""
        if self._splits[0] < DISPATCH_AFTER or not s:
            return self.prefixes
        got = self._by_first.get(s[0])
        if got is None:
            if len(self._by_first) >= 512:  # an odd log of many first characters: stay bounded
                return self.prefixes
            got = self._by_first[s[0]] = [p for p in self.prefixes if can_start_with(p, s[0])]
        return got

    def line(self, source: str, number: int, raw: bytes) -> Line:
        """One raw line, decoded and split."""
        text, truncated = decode(raw)
        return self.split(Line(source=source, number=number, text=text, truncated=truncated))

    def lines(self, source: Source) -> Iterator[Line]:
        """Every line of a source, decoded and split (for tools that need them all)."""
        number = 0
        for block in read_blocks(source):
            if block.endswith(b"\n"):
                block = block[:-1]
            for raw in block.split(b"\n"):
                number += 1
                yield self.line(source.name, number, raw)

    def split(self, line: Line) -> Line:
        """Fill level/timestamp/process/rank/location/message from line.text. A line of the
        same shape as one split before (its digits aside: every layer reads any digit alike)
        takes its fields from the same offsets: a rank's traceback printed by eight ranks, an
        engine's repeated error line, split once."""
        self._splits[0] += 1
        s = line.text
        if s.startswith(("│", "┃")):
            s = s.rstrip()
            if s.endswith(("│", "┃")):
                s = s[:-1].rstrip()
        learned = self._learned.get(line.source)
        if learned and not s.startswith(learned):
            learned = None
        key = None
        if len(s) <= PLAN_MAX and s.isascii() and self._splits[0] > DISPATCH_AFTER:  # (s is the text)
            if self._blind[0] is None:
                self._blind[0] = all(digit_blind(p) for p in (*self.prefixes, *_HELPERS))
            if self._blind[0]:
                # (the wrapper this source's lines showed is matched as it is, digits and all)
                key = (learned, s.encode().translate(ZERO_DIGITS))
                plan = self._plans.get(key)
                if plan is not None:
                    return _replay(line, plan)
        off = 0  # where s begins in the text
        if learned:
            s, off = s[len(learned) :], len(learned)  # a wrapper this source's other lines showed (below)
        spans: dict[str, tuple[int, int]] = {}
        rest = self._peel(line, s, spans)
        if rest is s and s and not s[0].isspace():
            # no layer known at the start: a wrapper we do not know (a custom logger, `kubectl
            # logs --prefix`, `cat -n`) may sit in front of a layout we do; take it only when
            # what follows reads as a whole engine prefix (a level and a time or a process)
            for m in _LAYOUT_START.finditer(s, 1, min(len(s), 160)):
                if s[m.start() - 1] not in _WRAPPER_ENDS:
                    continue
                trial = Line(source=line.source, number=line.number, text=line.text)
                after = self._peel(trial, s[m.start() :], {})
                if trial.level and (trial.timestamp or trial.process):
                    for k in ("level", "timestamp", "pid", "process", "rank", "location"):
                        setattr(line, k, getattr(trial, k))
                    rest = after
                    key = None  # (no plan: what it learned changes how the source's lines split)
                    if len(self._learned) < 64:
                        # the same text in front of this source's other lines (tracebacks, bare
                        # messages) is that wrapper too
                        self._learned[line.source] = s[: m.start()]
                    break
        line.message = rest
        if key is not None:
            end = off + len(s)  # s is the text from `off`, its border's end cut: the message ends there
            plan = [(k, a + off, b + off) for k, (a, b) in spans.items()]
            kept(self._plans, key, (*plan, ("message", end - len(rest), end)), PLANS_KEPT)
        return line

    def _peel(self, line: Line, s: str, spans: dict[str, tuple[int, int]]) -> str:
        """Peel the known prefix layers off s into the line's fields; the rest (s itself when
        none matched). `spans`: where in s each field's value was taken from (split's plans)."""
        level_seen = False
        base = 0  # where the rest begins in s
        for _ in range(10):
            for pat in self._layers(s):
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
                        spans["level"] = _at(m, "level" if g.get("level") else "lv1", base)
                    level_seen = True
                ts = g.get("ts")
                if ts and not line.timestamp:
                    line.timestamp = ts
                    spans["timestamp"] = _at(m, "ts", base)
                proc = g.get("proc")
                if g.get("pid"):  # the innermost layer's: the engine's own process, not a wrapper's
                    line.pid = int(g["pid"])
                    spans["pid"] = _at(m, "pid", base)
                    if proc:
                        line.process = proc.strip().rstrip(",")
                        spans["process"] = _stripped(m, "proc", base, line.process)
                        r = _RANK_IN_PROC.search(proc)
                        if r and line.rank is None:
                            line.rank = int(r.group(1))
                            spans["rank"] = _at(r, 1, base + m.start("proc"))
                tags = g.get("tags")
                if tags:
                    line.process = tags.strip()
                    spans["process"] = _stripped(m, "tags", base, line.process)
                    r = _SGLANG_TP.search(tags)
                    if r and line.rank is None:
                        line.rank = int(r.group(1))
                        spans["rank"] = _at(r, 1, base + m.start("tags"))
                if g.get("rank") and line.rank is None:
                    line.rank = int(g["rank"])
                    spans["rank"] = _at(m, "rank", base)
                loc = g.get("loc") or g.get("loc2")
                if loc and not line.location:
                    line.location = loc
                    spans["location"] = _at(m, "loc" if g.get("loc") else "loc2", base)
                if g.get("spans"):
                    r = _TGI_RANK.search(s)
                    if r and line.rank is None:
                        line.rank = int(r.group(1))
                        spans["rank"] = _at(r, 1, base)
                base += m.end()
                s = s[m.end() :]
                break
            else:
                break
        return s


def _at(m: re.Match[str], group: str | int, base: int) -> tuple[int, int]:
    a, b = m.span(group)
    return base + a, base + b


def _stripped(m: re.Match[str], group: str, base: int, value: str) -> tuple[int, int]:
    """Where a group's value, stripped (`value`), begins and ends: after its leading blanks."""
    text = m.group(group)
    a = base + m.start(group) + len(text) - len(text.lstrip())
    return a, a + len(value)


_INTS = frozenset({"pid", "rank"})


def _replay(line: Line, plan: tuple[tuple[Any, ...], ...]) -> Line:
    """A line split by the plan of a line of its shape: each field from the same offsets."""
    text = line.text
    for field, a, b in plan:
        value = text[a:b]
        if field == "level":
            line.level = _LEVEL_NORMAL.get(value, value)
        elif field in _INTS:
            setattr(line, field, int(value))
        else:
            setattr(line, field, value)
    return line
