"""The streaming library API: a session per log source, fed lines or bytes as they come, an
event on each change of its verdict.

In: lines or bytes per source. Out: `Event`s; `Sessions` for many sources.

    from diagnose.stream import Sessions
"""

from .session import EVENT_KINDS, FEED_BYTES, SCHEMA, Event, Sessions, StreamSession, scan_lines

__all__ = ["EVENT_KINDS", "FEED_BYTES", "SCHEMA", "Event", "Sessions", "StreamSession", "scan_lines"]
