"""The node agent behind `diagnose watch --glob`: every log file matching a pattern followed
at once (the kubelet's `/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log`,
or any other files), new ones picked up, rotation followed, one session per container.

Polling, not a watch per file: one stat per file per interval serves thousands of files with
one thread (inotify's per-user watch limit is 8,192 by default, and network file systems
send no events). Rotation as the kubelet and logrotate do it:
- renamed (the kubelet's `0.log` → `0.log.<time>`, a new `0.log`): the old file is read to its
  end through the descriptor still open, then the new one from its start;
- truncated in place (copytruncate): read again from the start;
- removed (the pod deleted): read to its end, then the source's session is closed.
A file's reads are bounded per poll, so one chatty container cannot starve the others.
"""

from __future__ import annotations

import glob as globmod
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

from .record_shapes import Record

READ_PER_POLL = 1 << 20  # bytes read from one file per poll, at most
LINE_MAX = 1 << 20
# /var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log
_POD_DIR = re.compile(r"/(?P<ns>[^/_]+)_(?P<pod>[^/_]+)_[0-9a-f-]{8,}/(?P<container>[^/]+)/\d+\.log$")
# /var/log/containers/<pod>_<namespace>_<container>-<container id>.log
_CONTAINERS = re.compile(r"/(?P<pod>[^/_]+)_(?P<ns>[^/_]+)_(?P<container>.+)-[0-9a-f]{64}\.log$")
# Docker's json-file driver: /var/lib/docker/containers/<id>/<id>-json.log (rotated: .1, .2…)
_DOCKER = re.compile(r"/containers/(?P<id>[0-9a-f]{12,64})/(?P=id)-json\.log(?:\.\d+)?$")


def identity(path: str, node: str = "") -> tuple[str, dict[str, str]]:
    """The session key and labels of a log file: namespace/pod/container when the path is the
    kubelet's, the container's id when it is Docker's json-file, else the path itself."""
    m = _POD_DIR.search(path) or _CONTAINERS.search(path)
    if m is None:
        docker = _DOCKER.search(path)
        if docker is not None:  # a container of Docker's own: its id (the scan unwraps its JSON lines)
            cid = docker["id"][:12]
            return cid, {"container_id": cid, **({"node": node} if node else {})}
        return path, ({"node": node} if node else {})
    labels = {"namespace": m["ns"], "pod": m["pod"], "container": m["container"]}
    if node:
        labels["node"] = node
    return f"{m['ns']}/{m['pod']}/{m['container']}", labels


@dataclass
class _Tail:
    path: str
    f: IO[bytes]
    ino: int
    pos: int = 0
    partial: bytes = b""
    old: list[IO[bytes]] = field(default_factory=list)  # rotated away, still to be read to the end

    def read(self, f: IO[bytes], limit: int) -> list[bytes]:
        data = f.read(limit)
        if not data:
            return []
        if f is self.f:
            self.pos += len(data)
        data = self.partial + data
        cut = data.rfind(b"\n")
        if cut < 0:
            self.partial = data[-LINE_MAX:]
            return []
        self.partial = data[cut + 1 :]
        return data[:cut].split(b"\n")


class NodeAgent:
    """Yields the records of every followed file, poll after poll."""

    def __init__(self, pattern: str, from_end: bool = False, node: str | None = None):
        self.pattern = pattern
        self.node = node if node is not None else os.environ.get("NODE_NAME", "")
        self._tails: dict[str, _Tail] = {}
        self._skip_existing = from_end  # only for the files there at the first poll
        self.closed_sources: list[str] = []  # sources whose files are gone (their session may end)
        self.problems: list[str] = []  # files that could not be opened, to say (once each)
        self._refused: set[str] = set()

    def _open(self, path: str, at_end: bool) -> _Tail | None:
        try:
            f = open(path, "rb")  # noqa: SIM115 - kept open while followed
            st = os.fstat(f.fileno())
        except OSError as e:  # said once a path (no permission, too many open files), tried again
            if path not in self._refused:
                self._refused.add(path)
                self.problems.append(f"{path}: cannot read: {e.strerror or e}")
            return None
        self._refused.discard(path)
        t = _Tail(path, f, st.st_ino)
        if at_end:
            t.pos = f.seek(0, os.SEEK_END)
        return t

    def poll(self) -> Iterator[Record]:
        """One pass: new files, rotated ones, truncated ones, removed ones; their new lines."""
        paths = sorted(globmod.glob(self.pattern), key=_restart_order)
        seen = set()
        for path in paths:
            if not os.path.isfile(path):
                continue
            seen.add(path)
            t = self._tails.get(path)
            if t is None:
                t = self._open(path, self._skip_existing)
                if t is None:
                    continue
                self._tails[path] = t
            else:
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if st.st_ino != t.ino:  # renamed away and a new file in its place
                    fresh = self._open(path, False)
                    if fresh is not None:
                        fresh.old = [*t.old, t.f]
                        fresh.partial = t.partial
                        self._tails[path] = t = fresh
                elif st.st_size < t.pos:  # copytruncate
                    t.f.seek(0)
                    t.pos = 0
            yield from self._records(t)
        self._skip_existing = False
        for path in [p for p in self._tails if p not in seen]:  # removed: read to the end, then close
            t = self._tails.pop(path)
            t.old.append(t.f)
            t.f = open(os.devnull, "rb")  # noqa: SIM115 - nothing more comes at this path
            yield from self._records(t, drain=True)
            t.f.close()
            source, _ = identity(path, self.node)
            if not any(identity(p, self.node)[0] == source for p in self._tails):
                self.closed_sources.append(source)

    def _records(self, t: _Tail, drain: bool = False) -> Iterator[Record]:
        source, labels = identity(t.path, self.node)
        budget = READ_PER_POLL
        while t.old:  # what was written before the rotation comes first
            lines = t.read(t.old[0], budget)
            if lines:
                yield Record(source, labels, [x.decode("utf-8", "replace") for x in lines], "file")
                budget -= sum(len(x) + 1 for x in lines)
                if budget <= 0 and not drain:
                    return
                continue
            t.old.pop(0).close()
        lines = t.read(t.f, budget)
        if drain and t.partial:
            lines.append(t.partial)
            t.partial = b""
        if lines:
            yield Record(source, labels, [x.decode("utf-8", "replace") for x in lines], "file")

    def close(self) -> None:
        for t in self._tails.values():
            for f in (*t.old, t.f):
                f.close()
        self._tails.clear()


def _restart_order(path: str) -> tuple[str, int, str]:
    """A container's restarts in order (1.log before 10.log): its earlier run's log first."""
    d, name = os.path.split(path)
    stem = name.split(".", 1)[0]
    return (d, int(stem) if stem.isdigit() else -1, name)
