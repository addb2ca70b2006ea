"""Rule, profile and incident files as they last validated, kept between runs.

Parsing YAML and validating a rule file (compiling every pattern, running every example)
costs more than the rest of a short scan. A file whose path, size and modification time
match the entry recorded when it last validated cleanly is read from this cache instead
(`marshal`, no import cost), and its patterns compile on first use. Any edit changes the
size or the time and sends the file through YAML and validation again. The cache is
written atomically and is only ever a shortcut: a missing, stale or corrupt one is ignored.
DIAGNOSE_CACHE=DIR moves it; DIAGNOSE_CACHE=off disables it.
"""

from __future__ import annotations

import marshal
import os

from .. import __version__
from .atomic import atomic_write

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    T = TypeVar("T")

_FORMAT = 1
_MAX_ENTRIES = 2000
_DATE = "__date__"  # marshal has no dates (YAML incident dates): stored as tagged tuples


def _freeze(v: Any) -> tuple[Any, bool]:
    """The value with dates as tagged tuples (YAML data has no tuples of its own), and whether any were."""
    import datetime as dt  # only when a file is stored, not when one is read

    if isinstance(v, dict):
        items = [(k, _freeze(x)) for k, x in v.items()]
        return {k: f for k, (f, _) in items}, any(t for _, (_, t) in items)
    if isinstance(v, list):
        items2 = [_freeze(x) for x in v]
        return [f for f, _ in items2], any(t for _, t in items2)
    if isinstance(v, dt.datetime):
        return (_DATE, "datetime", v.isoformat()), True
    if isinstance(v, dt.date):
        return (_DATE, "date", v.isoformat()), True
    return v, False


def _thaw(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _thaw(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_thaw(x) for x in v]
    if isinstance(v, tuple) and len(v) == 3 and v[0] == _DATE:
        import datetime as dt

        return dt.datetime.fromisoformat(v[2]) if v[1] == "datetime" else dt.date.fromisoformat(v[2])
    return v


class DataCache:
    def __init__(self, file: str | None):
        self.file = file
        self._entries: dict[str, tuple[int, int, bool, Any]] | None = None
        self._dirty = False

    def _load(self) -> dict[str, tuple[int, int, bool, Any]]:
        if self._entries is None:
            self._entries = {}
            if self.file is not None:
                try:
                    with open(self.file, "rb") as f:
                        doc = marshal.loads(f.read())
                    if isinstance(doc, dict) and doc.get("format") == (_FORMAT, __version__):
                        self._entries = doc["entries"]
                except (OSError, ValueError, EOFError, TypeError, KeyError):
                    pass  # no cache yet, or one from another version: start afresh
        return self._entries

    @staticmethod
    def _key(path: str) -> tuple[str, int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return os.path.abspath(path), st.st_mtime_ns, st.st_size

    def get(self, path: str) -> tuple[bool, Any]:
        """(True, data) when the file is unchanged since it validated, else (False, None)."""
        if self.file is None:
            return False, None
        key = self._key(path)
        entry = self._load().get(key[0]) if key else None
        if key is None or entry is None or entry[:2] != key[1:]:
            return False, None
        return True, _thaw(entry[3]) if entry[2] else entry[3]

    def put(self, path: str, data: Any) -> None:
        """Record a file that validated cleanly, with the data it parsed to."""
        if self.file is None:
            return
        key = self._key(path)
        if key is None:
            return
        frozen, tagged = _freeze(data)
        try:
            marshal.dumps(frozen)
        except ValueError:
            return  # a value marshal cannot hold: this file is simply not cached
        self._load()[key[0]] = (key[1], key[2], tagged, frozen)
        self._dirty = True

    def save(self) -> None:
        """Write what changed (best effort, atomic; a read-only home is fine)."""
        if not self._dirty or self.file is None or self._entries is None:
            return
        self._dirty = False
        entries = {k: v for k, v in self._entries.items() if os.path.exists(k)}
        if len(entries) > _MAX_ENTRIES:
            entries = dict(list(entries.items())[-_MAX_ENTRIES:])
        try:
            os.makedirs(os.path.dirname(self.file), exist_ok=True)
            atomic_write(self.file, marshal.dumps({"format": (_FORMAT, __version__), "entries": entries}))
        except (OSError, ValueError):
            pass


def _cache_file() -> str | None:
    env = os.environ.get("DIAGNOSE_CACHE")
    if env == "off":
        return None
    if env:
        return os.path.join(env, "validated.marshal")
    from .userdirs import user_cache_dir

    return os.path.join(user_cache_dir(), "validated.marshal")


_cache: DataCache | None = None


def data_cache() -> DataCache:
    """The process's cache (its location read from the environment once)."""
    global _cache
    if _cache is None or _cache.file != _cache_file():
        _cache = DataCache(_cache_file())
    return _cache


def load_yaml(path: str) -> Any:
    """A data file's YAML; a file that is not YAML or cannot be read is a RuleError naming it."""
    import yaml  # only for files the cache does not hold

    from .errors import RuleError

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser: ten times faster
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.load(f, Loader=loader)
    except yaml.YAMLError as e:
        from .errors import yaml_problem

        raise RuleError(path, None, None, f"not valid YAML: {yaml_problem(e)}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RuleError(path, None, None, f"cannot read: {e}") from None


def load_validated(path: str, parse: Callable[[Any, bool], T]) -> T:
    """One data file through the cache: `parse(data, trusted)` checks what YAML gave (raising
    names the problem) or takes what validated before (trusted), and a file that just passed
    is cached for the next run."""
    cache = data_cache()
    trusted, data = cache.get(path)
    if not trusted:
        data = load_yaml(path)
    out = parse(data, trusted)
    if not trusted:
        cache.put(path, data)
        cache.save()
    return out
