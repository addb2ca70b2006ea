"""Where diagnose keeps its cache and the user's incident store.

On Linux these are the XDG directories, computed here: importing platformdirs for them cost
a few milliseconds of every cold start. Elsewhere platformdirs knows the platform's rules.
Paths are strings (os.path): pathlib's import is another few milliseconds of every scan.
"""

from __future__ import annotations

import os
import sys

APP = "diagnose"


def _xdg(var: str, default: str) -> str:
    value = os.environ.get(var, "").strip()
    return os.path.join(value if value else os.path.expanduser(default), APP)


def user_cache_dir() -> str:
    if sys.platform.startswith("linux"):
        return _xdg("XDG_CACHE_HOME", "~/.cache")
    from platformdirs import user_cache_dir as platform_cache

    return str(platform_cache(APP))


def user_data_dir() -> str:
    if sys.platform.startswith("linux"):
        return _xdg("XDG_DATA_HOME", "~/.local/share")
    from platformdirs import user_data_dir as platform_data

    return str(platform_data(APP))
