"""Styled lines for people: built once, printed through rich on a terminal, as plain text elsewhere.

A renderer produces `StyledLines` (segments of text with a rich style name). On a pipe or a
file, styles are dropped and the text is written directly — which is all rich would do there —
so a plain `diagnose scan … | less` never pays rich's import (~25 ms of a cold start).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import IO, Any

Segment = tuple[str, str]  # (text, rich style; "" for none)


class StyledLines:
    def __init__(self) -> None:
        self.lines: list[list[Segment]] = []

    def add(self, *segments: str | Segment, style: str = "") -> None:
        """One line: plain strings take `style`, (text, style) pairs keep their own."""
        self.lines.append([(s, style) if isinstance(s, str) else s for s in segments])

    def blank(self) -> None:
        self.lines.append([])

    def plain(self) -> str:
        return "".join("".join(t for t, _ in line) + "\n" for line in self.lines)


def wants_rich(stream: IO[str] | None = None) -> bool:
    """Colour is possible only on a terminal, or when FORCE_COLOR / TTY_COMPATIBLE ask for it
    (rich itself then applies NO_COLOR, TERM=dumb and the rest)."""
    if os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE") == "1":
        return True
    stream = stream or sys.stdout
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def print_styled(out: StyledLines, console: Any = None) -> None:
    """Print through `console` (a rich Console) when given or when colour is possible, else plain."""
    if console is None and not wants_rich():
        sys.stdout.write(out.plain())
        sys.stdout.flush()
        return
    from rich.text import Text

    if console is None:
        from rich.console import Console

        console = Console(highlight=False, soft_wrap=True)
    for line in out.lines:
        console.print(Text.assemble(*line) if line else "")
