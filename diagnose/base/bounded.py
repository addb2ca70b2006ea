"""A memo whose memory stays flat however long the input: when it holds its limit it is
forgotten whole (one clear, and the few keys a long input keeps asking for are back after a
handful of misses), rather than tracking which entry to evict."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import TypeVar

    K = TypeVar("K")
    V = TypeVar("V")


def kept(memo: dict[K, V], key: K, value: V, limit: int) -> V:
    """Keep `value` under `key` (the memo cleared first when it holds `limit` entries); the value."""
    if len(memo) >= limit:
        memo.clear()
    memo[key] = value
    return value
