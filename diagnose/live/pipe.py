"""`vllm serve … 2>&1 | diagnose` watched by a person: the server's output passes through to
the terminal as it comes, and the verdict is said on stderr the moment it is known — a fatal
error while the server stays up included — then the final report when the output ends.

(Piped on to a file or a program, `| diagnose` stays `scan -`: the report alone, at the end.)
"""

from __future__ import annotations

import os
import selectors
import sys
import time
from typing import Any

TICK_S = 1.0


def tee_and_judge(know: Any, engine: str | None = None) -> int:
    """Pass stdin through to stdout, judge it live; the exit code of the verdict."""
    from rich.console import Console

    from ..outputs.styled import print_styled
    from ..outputs.text import render_text
    from ..stream.session import StreamSession

    session = StreamSession("-", know, engine)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    out = sys.stdout.buffer
    fd = sys.stdin.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    told: Any = None  # the failure said while the server ran

    def tell(events: list[Any]) -> None:
        nonlocal told
        for e in events:
            if e.kind in ("failed", "hang") and told is None and e.diagnosis is not None:
                told = e.diagnosis
                err.print(
                    "─" * 20 + " diagnose: the server failed; it may still be up " + "─" * 20,
                    style="bold red",
                )
                print_styled(render_text(e.diagnosis), err)
            elif e.kind == "ready" and e.diagnosis is not None:
                from ..pipeline.durations import said

                took = said(e.diagnosis.durations) or "ready"
                err.print(f"diagnose: {took}; watching for runtime failures", style="bold green")

    last = time.monotonic()
    while True:
        ready = sel.select(timeout=TICK_S)
        if ready:
            data = os.read(fd, 1 << 16)
            if not data:
                break
            out.write(data)
            out.flush()
            tell(session.feed(data))
        if time.monotonic() - last >= TICK_S:
            last = time.monotonic()
            tell(session.tick())
    sel.close()
    events = session.close()
    tell(events)
    final = session.diagnosis()
    if told is None or final.primary is not told.primary:
        err.print("─" * 20 + " diagnose: the output ended " + "─" * 20, style="bold")
        print_styled(render_text(final), err)
    return 1 if final.status in ("failed", "degraded") else 0
