"""The rule hits one scan keeps: every hit counted, the first ones and a window of the latest
kept per rule (memory stays flat on a log that repeats one error), in the order they came."""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

from ..knowledge.rules import Rule
from ..model.records import Hit, TracebackEvent, VocabHit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Hits kept in memory per rule: the first ones and the latest ones (a restart loop's last run
# must be seen whatever came before it); the count goes on.
FIRST_HITS_KEPT = 32
LAST_HITS_KEPT = 32


@dataclass(slots=True)
class RecordedHit:
    """A rule's hit with where the scan stood: run, phase, traceback, words near it."""

    hit: Hit
    rule: Rule | None  # None for a synthetic unknown-error hit
    run: int
    phase_at: str | None
    reached: frozenset[str]
    last_time: str | None
    tb: TracebackEvent | None = None
    near_tb: TracebackEvent | None = None  # another stream's traceback right after it
    phase_after: str | None = None
    synthetic_title: str | None = None
    vocab: list[VocabHit] = field(default_factory=list)  # class words near it (unexplained errors)


class HitBook:
    def __init__(self, keep_rule_lines: bool = False):
        self.keep_rule_lines = keep_rule_lines
        self.hits: list[RecordedHit] = []  # the first FIRST_HITS_KEPT of each rule
        self.counts: dict[str, int] = defaultdict(int)
        self.rule_runs: dict[str, int] = defaultdict(int)  # in how many runs each rule hit
        self.rule_lines: dict[str, list[int]] = defaultdict(list)  # `rules test LOG`
        self._seq = 0  # order of recorded hits, for the first and the latest kept per rule
        self._hit_seq: list[int] = []
        self._tail: dict[str, deque[tuple[int, RecordedHit]]] = {}
        self._last_run: dict[str, int] = {}

    @property
    def recorded(self) -> int:
        """Hits recorded so far (kept or not): a change to what the scan knows."""
        return self._seq

    def count(self, rid: str, line_number: int | None = None) -> None:
        """One more hit of the rule (`line_number`: where, for `rules test LOG`)."""
        self.counts[rid] += 1
        if line_number is not None and self.keep_rule_lines and len(self.rule_lines[rid]) < 1000:
            self.rule_lines[rid].append(line_number)

    def keep(self, rid: str, rec: RecordedHit) -> None:
        """Keep the rule's first hits and a window of its latest; count the runs it hit in."""
        self._seq += 1
        if self._last_run.get(rid) != rec.run:
            self._last_run[rid] = rec.run
            self.rule_runs[rid] += 1
        if self.counts[rid] <= FIRST_HITS_KEPT:
            self.hits.append(rec)
            self._hit_seq.append(self._seq)
        else:
            self._tail.setdefault(rid, deque(maxlen=LAST_HITS_KEPT)).append((self._seq, rec))

    def kept(self) -> list[RecordedHit]:
        """Every kept hit, in the order they came."""
        if not self._tail:
            return list(self.hits)
        both = [*zip(self._hit_seq, self.hits, strict=True), *(x for t in self._tail.values() for x in t)]
        return [rec for _seq, rec in sorted(both, key=lambda x: x[0])]

    def result_fields(self) -> dict[str, Any]:
        """Its part of a ScanResult."""
        return {
            "hits": self.kept(),
            "hit_counts": dict(self.counts),
            "rule_lines": dict(self.rule_lines),
            "rule_runs": dict(self.rule_runs),
        }
