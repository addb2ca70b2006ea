"""Multi-literal search over blocks of bytes: every needle occurrence, in one pass.

Python's `re` alternation of a few hundred literals runs at ~2 MB/s; a compiled
Aho-Corasick automaton (the `ahocorasick-rs` package, Rust) runs at hundreds of MB/s, and
Hyperscan (the `hyperscan` package over Vectorscan: SIMD literal matching) at GB/s once
built. The pure fallback (one `bytes.find` sweep per needle) is slower but works
everywhere, behind the same interface.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Protocol

    class NeedleIndex(Protocol):
        name: str

        def find(self, block: bytes) -> list[tuple[int, int]] | list[tuple[int, int, int]]:
            """(needle id, start offset[, end]) of every occurrence, overlapping ones included, by start."""
            ...

        def present(self, data: bytes) -> frozenset[int]:
            """The ids of the needles that occur in the data."""
            ...


class AhoCorasickIndex:
    name = "aho-corasick"

    def __init__(self, needles: Sequence[bytes], fast_build: bool = False):
        import ahocorasick_rs

        impl = ahocorasick_rs.Implementation
        # A DFA scans ~1.6× faster than an NFA but takes ~8× longer to build (3.7 vs 0.45 ms for
        # our needles): NFAs while the needle set still changes at startup, a DFA for the long haul.
        self._ac = ahocorasick_rs.BytesAhoCorasick(
            list(needles),
            matchkind=ahocorasick_rs.MatchKind.Standard,
            implementation=impl.ContiguousNFA if fast_build else impl.DFA,
        )

    def find(self, block: bytes) -> list[tuple[int, int, int]]:
        # the library's (id, start, end) triples as they come: re-packing them cost more than the search
        return self._ac.find_matches_as_indexes(block, overlapping=True)  # type: ignore[no-any-return]

    def present(self, data: bytes) -> frozenset[int]:
        """The ids of the needles in the data (a line's literal test: one call, not two)."""
        return frozenset([m[0] for m in self._ac.find_matches_as_indexes(data, True)])


class HyperscanIndex:
    """The long-haul index: 4-5x an Aho-Corasick DFA's speed on a log's blocks (few matches,
    most bytes skipped by its SIMD literal matcher), but ~15 ms to build, so only where a DFA
    would be built. Matches come by end offset (Aho-Corasick's order), ties in another order:
    every reader groups a line's matches as a set.

    `first_only` (Hyperscan's SINGLEMATCH): each needle reported once, at its first end, for
    `present` on a long text: a pattern's literal test on a 200 KB request dump in ~70 us,
    where Aho-Corasick, reporting every one of its hundreds of matches, takes ~450 us. Such
    an index builds in under a millisecond."""

    name = "hyperscan"

    def __init__(self, needles: Sequence[bytes], first_only: bool = False):
        import hyperscan

        self._hs = hyperscan
        self._lens = [len(n) for n in needles]
        self._db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        flags = [hyperscan.HS_FLAG_SINGLEMATCH] * len(needles) if first_only else None
        try:
            self._db.compile(
                expressions=list(needles), ids=list(range(len(needles))), flags=flags, literal=True
            )
        except hyperscan.error as e:  # a CPU without SSSE3, a build without the literal API
            raise ImportError(f"hyperscan cannot build here: {e}") from e
        # the binding lets go of the GIL while it scans: one scratch space per thread
        self._local = threading.local()

    def find(self, block: bytes) -> list[tuple[int, int, int]]:
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = self._hs.Scratch(self._db)
        out: list[tuple[int, int, int]] = []
        add, lens = out.append, self._lens

        def on_match(nid: int, _from: int, end: int, _flags: int, _context: object) -> None:
            add((nid, end - lens[nid], end))  # literals: the start is the end less the length

        self._db.scan(block, match_event_handler=on_match, scratch=scratch)
        return out

    def present(self, data: bytes) -> frozenset[int]:
        return frozenset([m[0] for m in self.find(data)])


def make_presence(needles: Sequence[bytes]) -> HyperscanIndex | None:
    """A presence test for long texts (a first-only Hyperscan index) where Hyperscan runs here
    (None elsewhere, or with DIAGNOSE_NO_HYPERSCAN=1 / DIAGNOSE_PURE=1: the caller's index
    answers the same)."""
    if not needles or "1" in (os.environ.get("DIAGNOSE_PURE"), os.environ.get("DIAGNOSE_NO_HYPERSCAN")):
        return None
    try:
        return HyperscanIndex(needles, first_only=True)
    except ImportError:
        return None


class FindIndex:
    """Pure Python: one C-level `bytes.find` sweep per needle."""

    name = "bytes.find"

    def __init__(self, needles: Sequence[bytes]):
        self._needles = list(needles)

    def present(self, data: bytes) -> frozenset[int]:
        return frozenset(i for i, n in enumerate(self._needles) if n in data)

    def find(self, block: bytes) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        find = block.find
        for i, n in enumerate(self._needles):
            pos = find(n)
            while pos >= 0:
                out.append((i, pos))
                pos = find(n, pos + 1)
        out.sort(key=lambda m: m[1])
        return out


def make_index(needles: Sequence[bytes], fast_build: bool = False, blocks: bool = False) -> NeedleIndex:
    """The fastest index available here: quick to build (`fast_build`: the needle set still
    changes) or quick to scan; Hyperscan only for `blocks` (a log's blocks: a call costs it
    ~5 us more than Aho-Corasick, paid back only on long texts). DIAGNOSE_PURE=1 forces the
    pure one, DIAGNOSE_NO_HYPERSCAN=1 keeps Aho-Corasick for blocks too (the same matches)."""
    if not needles:
        return FindIndex([])
    if os.environ.get("DIAGNOSE_PURE") != "1":
        if blocks and not fast_build and os.environ.get("DIAGNOSE_NO_HYPERSCAN") != "1":
            try:
                return HyperscanIndex(needles)
            except ImportError:  # no wheel for this platform: Aho-Corasick does the same job
                pass
        try:
            return AhoCorasickIndex(needles, fast_build)
        except ImportError:
            pass
    return FindIndex(needles)
