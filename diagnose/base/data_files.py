"""Where the data shipped with the tool lies (rules, profiles, incidents, mined knowledge),
and which files of a data directory are read."""

from __future__ import annotations

import os


def builtin_rules_dir() -> str:
    """rules/ inside the installed package (the wheel ships it there), or at the top of the source tree."""
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # diagnose/, above base/
    packaged = os.path.join(package, "rules")
    return packaged if os.path.isdir(packaged) else os.path.join(os.path.dirname(package), "rules")


def yaml_files(directory: str) -> list[str]:
    """The directory's YAML files (*.yaml, *.yml; hidden ones skipped, as a shell glob does), sorted."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    paths = (os.path.join(directory, n) for n in names if n.endswith((".yaml", ".yml")) and n[0] != ".")
    return sorted(p for p in paths if os.path.isfile(p))


def data_dirs(extra_dirs: list[str] | None = None) -> list[str]:
    """The user's rule directories: `--rules DIR` (each), then DIAGNOSE_RULES (os.pathsep-separated).
    Rules are read from each, engine profiles from each one's engines/ folder."""
    dirs = [os.path.normpath(d) for d in extra_dirs or []]
    env = os.environ.get("DIAGNOSE_RULES")
    if env:
        dirs.extend(os.path.normpath(p) for p in env.split(os.pathsep) if p)
    return dirs
