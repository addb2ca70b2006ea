"""Files written whole or not at all: a crash or a full disk never leaves half of one."""

from __future__ import annotations

import os


def atomic_write(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write beside the target under a name of this process, flush to disk, then rename over it."""
    folder, name = os.path.split(os.fspath(path))
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
