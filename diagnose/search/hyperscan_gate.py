"""Hyperscan's word on a long text: a shipped pattern that cannot match it is not searched.

`re` runs a case-insensitive vocabulary of dozens of alternatives at a few MB/s: on an engine's
argument dump (SGLang's `server_args=ServerArgs(...)`, 2-15 KB on one line) or a request dump
(200 KB) that is milliseconds a pattern. Hyperscan compiles the same pattern as a prefilter
(HS_FLAG_PREFILTER: the lookarounds and other constructs it cannot run exactly are widened, so
it may report a match `re` would not, never miss one) and scans at hundreds of MB/s. Where it
finds nothing there is nothing; where it finds something, `re` searches as before.

Exact only where the two read characters alike: ASCII text (their case folding of other
letters differs) without U+001C-U+001F (whitespace to `re`'s \\s, not to Hyperscan's).
"""

from __future__ import annotations

import re
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_UNLIKE = re.compile("[\x1c-\x1f]")


class Gate:
    """One pattern compiled by Hyperscan as a prefilter (ImportError where it cannot be)."""

    __slots__ = ("_db", "_hs", "_local")

    def __init__(self, pattern: str):
        import hyperscan

        flags = hyperscan.HS_FLAG_PREFILTER
        flags |= hyperscan.HS_FLAG_SINGLEMATCH | hyperscan.HS_FLAG_ALLOWEMPTY
        if pattern.startswith("(?i)"):  # the one global flag the shipped patterns use, as a flag
            pattern, flags = pattern[4:], flags | hyperscan.HS_FLAG_CASELESS
        self._hs = hyperscan
        self._db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        try:
            self._db.compile(expressions=[pattern.encode("utf-8")], ids=[0], flags=[flags])
        except hyperscan.error as e:
            raise ImportError(f"hyperscan cannot compile {pattern[:60]!r}: {e}") from e
        self._local = threading.local()  # a scratch space per thread (the scan lets go of the GIL)

    def cannot_match(self, text: str) -> bool:
        """True only where the pattern certainly has no match in the text."""
        if not text.isascii() or _UNLIKE.search(text):
            return False
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = self._hs.Scratch(self._db)
        found: list[int] = []

        def on_match(_id: int, _from: int, _to: int, _flags: int, _context: Any) -> None:
            found.append(1)

        self._db.scan(text.encode("ascii"), match_event_handler=on_match, scratch=scratch)
        return not found


def gate_for(pattern: str) -> Gate | None:
    """The pattern's gate; None where Hyperscan is absent or cannot read the pattern (then
    every text is searched, as without it)."""
    try:
        return Gate(pattern)
    except ImportError:
        return None
