"""Ports on this host: is one free, and which process listens on it (from /proc)."""

from __future__ import annotations

import os


def bind_error(port: int, host: str = "127.0.0.1") -> int:
    """0 when this host can bind host:port now, else the errno (EADDRINUSE: someone holds it)."""
    import socket  # only when a port needs checking: not part of every scan's start

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno or -1
    return 0


def port_taken(port: int, host: str = "0.0.0.0") -> bool:
    """Whether something already holds the port (a privileged port or an address this host does
    not have is another problem, not a taken port)."""
    import errno

    return bind_error(port, "0.0.0.0" if host in ("", "::") else host) == errno.EADDRINUSE


def free_port(start: int, host: str = "127.0.0.1", tries: int = 50) -> int | None:
    """First port from start up that this host can bind now."""
    for p in range(max(start, 1024), min(start + tries, 65535)):
        if not bind_error(p, host):
            return p
    return None


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                for row in f:
                    cols = row.split()
                    if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(cols[9])
        except (OSError, ValueError):
            continue
    return inodes


def port_holder(port: int, max_pids: int = 5000) -> tuple[int, str] | None:
    """(pid, command line) of a process listening on `port` here, when /proc shows it."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()][:max_pids]
    except OSError:
        return None
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") in targets:
                    return int(pid), _cmdline(pid)
            except OSError:
                continue
    return None


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\x00", b" ").decode("utf-8", "replace").strip()[:200]
    except OSError:
        return ""
