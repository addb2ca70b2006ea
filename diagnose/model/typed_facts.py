"""Typed facts from a rule's named groups: numbers as numbers, sizes in GiB."""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

_UNITS = {
    "b": 1 / 2**30,
    "bytes": 1 / 2**30,
    "byte": 1 / 2**30,
    "kib": 1 / 2**20,
    "kb": 1 / 2**20,
    "mib": 1 / 2**10,
    "mb": 1 / 2**10,
    "gib": 1.0,
    "gb": 1.0,
    "tib": 1024.0,
    "tb": 1024.0,
}
_SIZE_RE = re.compile(r"^\s*(-?[0-9][0-9,]*(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_NUM_RE = re.compile(r"^[+-]?[0-9][0-9,]*(?:\.\d+)?$")


def size_gib(text: str) -> float | None:
    """'448.00 MiB' -> 0.4375; '0 bytes' -> 0.0; '7.34' -> 7.34 (GiB assumed); '-2.14 GiB' -> -2.14."""
    m = _SIZE_RE.match(text)
    if not m:
        return None
    value = float(m.group(1).replace(",", ""))
    unit = m.group(2).lower() or "gib"
    factor = _UNITS.get(unit)
    if factor is None:
        return None
    return round(value * factor, 4)


def number(text: str) -> int | float | None:
    t = text.strip()
    if not _NUM_RE.match(t):
        return None
    t = t.replace(",", "")
    return float(t) if "." in t else int(t)


def typed_facts(groups: dict[str, str | None]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in groups.items():
        if v is None or k.startswith("_"):
            continue
        if k.endswith("_gib"):
            g = size_gib(v)
            if g is not None:
                out[k] = g
            continue
        n = number(v)
        out[k] = n if n is not None else v.strip()
    return out


def as_int(v: Any) -> int | None:
    """A value as an integer, None when it is not one (a fact, a launch value, a profile default)."""
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return None


def as_float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


MOST_GIB = 4096.0  # more memory than any one accelerator (or a node's eight) has


def impossible_facts(facts: dict[str, Any]) -> set[str]:
    """The GiB figures a log states that cannot be: above the GPU total the same line gives, or
    above any accelerator's memory (a WSL driver reports 17179869184 GiB in use: 2^34)."""
    total = as_float(facts.get("total_gib"))
    out = set()
    for k, v in facts.items():
        x = as_float(v)
        if not k.endswith("_gib") or k == "total_gib" or x is None:
            continue
        if x > MOST_GIB or (total and k not in ("tried_gib",) and x > total * 1.05):
            out.add(k)
    return out
