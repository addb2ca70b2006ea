"""Follow a log file by name, like `tail -F`, on watchdog events.

Waits for a file that does not exist yet; survives rotation (rename + create, delete +
create: the old file is read on while its writer still writes it, until the new one has
data) and truncation (copytruncate: the part of the old content not read yet is read from
the rotated copy); holds a partial last line until its newline arrives; never drops or
repeats a line the file system still holds (the model is Fluent Bit's tail input). Sleeps
on an event between writes, so an idle follow costs nothing: inotify where it works,
watchdog's polling observer where it does not (NFS, Docker bind mounts) or when asked with
`poll=True`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

READ_SIZE = 1 << 20
HEAD_BYTES = 256  # the file's first bytes: a copytruncate that was rewritten past our offset changes them
SAFETY_CHECK_S = 1.0  # also look every second: events can be lost or coalesced


@dataclass
class FileId:
    dev: int
    ino: int


def _file_id(path: str) -> FileId | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileId(st.st_dev, st.st_ino)


class Follower:
    """Calls `on_block(bytes)` with runs of complete lines as the file grows."""

    def __init__(
        self,
        path: str,
        on_block: Callable[[bytes], None],
        from_end: bool = False,
        poll: bool = False,
        poll_interval: float = 0.25,
    ):
        self.path = os.path.abspath(path)
        self.on_block = on_block
        self.from_end = from_end
        self.poll = poll
        self.poll_interval = poll_interval
        self.wake = threading.Event()
        self._f: BinaryIO | None = None
        self._id: FileId | None = None
        self._partial = b""
        self._head = b""  # the first HEAD_BYTES of the file as we read them
        self._observer = None
        self.rotations = 0
        self.truncations = 0

    # --- watchdog ------------------------------------------------------------------------

    def start(self) -> None:
        from watchdog.events import FileSystemEvent, FileSystemEventHandler

        follower = self

        class Wake(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                follower.wake.set()

        directory = os.path.dirname(self.path) or "."
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"{directory}: no such directory to watch")
        observer = None
        if not self.poll:
            try:
                from watchdog.observers import Observer

                observer = Observer()
                observer.schedule(Wake(), directory, recursive=False)
                observer.start()
            except OSError:
                observer = None  # inotify limits or an unsupported file system: poll instead
        if observer is None:
            from watchdog.observers.polling import PollingObserver

            observer = PollingObserver(timeout=self.poll_interval)
            observer.schedule(Wake(), directory, recursive=False)
            observer.start()
        self._observer = observer
        self._open(initial=True)
        self.wake.set()

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=2)
            self._observer = None
        if self._f is not None:
            self._f.close()
            self._f = None

    @property
    def observer_kind(self) -> str:
        return type(self._observer).__name__ if self._observer is not None else "none"

    # --- reading -------------------------------------------------------------------------

    def _open(self, initial: bool = False) -> bool:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - kept open while following
        except OSError:
            return False
        self._f = f
        self._id = FileId(os.fstat(f.fileno()).st_dev, os.fstat(f.fileno()).st_ino)
        self._head = self._read_head()
        if initial and self.from_end:
            f.seek(0, os.SEEK_END)
        return True

    def _read_head(self) -> bytes:
        assert self._f is not None
        try:
            return os.pread(self._f.fileno(), HEAD_BYTES, 0)
        except OSError:
            return b""

    def _rewritten(self, size: int | None) -> bool:
        """Truncated and written again since we last looked: smaller than where we are, or
        (written past our offset already) its first bytes are no longer the ones we read."""
        assert self._f is not None
        if size is not None and size < self._f.tell():
            return True
        head = self._read_head()
        n = min(len(head), len(self._head))
        if n and head[:n] != self._head[:n]:
            return True
        if len(head) > len(self._head):
            self._head = head  # the file was still shorter than HEAD_BYTES: keep what it has now
        return False

    def _drain(self, f: BinaryIO | None = None) -> None:
        """Read everything the open file (or `f`) has now; hand over complete lines."""
        f = f or self._f
        if f is None:
            return
        while True:
            chunk = f.read(READ_SIZE)
            if not chunk:
                break
            data = self._partial + chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                self._partial = data
                continue
            self._partial = data[cut + 1 :]
            self.on_block(data[: cut + 1])

    def check(self) -> None:
        """One round: read new data, then handle truncation and rotation."""
        if self._f is None and not self._open():
            return
        assert self._f is not None
        try:
            size = os.fstat(self._f.fileno()).st_size
        except OSError:
            size = None
        # look for a rewrite before reading on: after a copytruncate the bytes at our offset
        # belong to the new content's middle
        if not self._rewritten(size):
            self._drain()
        else:
            self._truncated()
        now = _file_id(self.path)
        if now is not None and now != self._id:
            self._rotated()

    def _truncated(self) -> None:
        """copytruncate: the file started over. What the old content had past our offset was
        copied away first: read it from the copy (a sibling whose first bytes are the ones we
        read), then the new content from its start. (Lines written between the copy and the
        truncation are lost by the rotation itself: they are in neither file.)"""
        assert self._f is not None
        self.truncations += 1
        offset = self._f.tell()
        copy = self._copy_of_old(offset)
        if copy is not None:
            with open(copy, "rb") as old:
                old.seek(offset)
                self._drain(old)
        self.flush_partial()
        self._f.seek(0)
        self._head = self._read_head()
        self._drain()

    def _copy_of_old(self, offset: int) -> str | None:
        """The rotated copy of the content we were reading: `name.1`, `name-20261203`… in the
        same directory, at least `offset` long, starting with the bytes we read first."""
        directory, base = os.path.split(self.path)
        if not self._head:
            return None
        try:
            names = [n for n in os.listdir(directory or ".") if n != base and n.startswith(base)]
        except OSError:
            return None
        best: tuple[float, str] | None = None
        for n in names:
            p = os.path.join(directory, n)
            try:
                st = os.stat(p)
                if st.st_size < offset or n.endswith((".gz", ".xz", ".bz2", ".zst")):
                    continue
                with open(p, "rb") as fh:
                    head = fh.read(len(self._head))
            except OSError:
                continue
            if head == self._head and (best is None or st.st_mtime > best[0]):
                best = (st.st_mtime, p)
        return best[1] if best else None

    def _rotated(self) -> None:
        """Renamed or deleted, and a file of the name is there again. The writer may go on
        writing the old one until it reopens (logrotate `create` with a postrotate HUP): keep
        reading the old file while the new one is still empty; once the new one has data the
        writer has moved (its last write to the old one is done), so finish the old one and
        switch."""
        assert self._f is not None
        self._drain()
        try:
            new_size = os.stat(self.path).st_size
        except OSError:
            return  # gone again: keep the old one
        if new_size == 0:
            return
        self._drain()
        self.flush_partial()
        self._f.close()
        self._f = None
        self.rotations += 1
        if self._open():
            self._drain()

    def flush_partial(self) -> None:
        """Hand over a last line that never got its newline (the writer is gone)."""
        if self._partial:
            data, self._partial = self._partial, b""
            self.on_block(data + b"\n")

    def wait(self, timeout: float) -> None:
        """Sleep until the directory changes or `timeout` passes."""
        self.wake.wait(min(timeout, SAFETY_CHECK_S))
        self.wake.clear()
