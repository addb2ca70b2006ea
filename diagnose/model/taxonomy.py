"""The failure taxonomy (rules/taxonomy/taxonomy.yaml): layers, classes in triage order with their
verify texts, startup phases with their labels, hang budgets and what they wait on, and the
OOM phases. Read once per process, from the validated-data cache when the file is unchanged
(no YAML import on a scan); a file with a missing or wrong field is named (file, id, field)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..base.data_files import builtin_rules_dir
from ..base.errors import RuleError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


@dataclass(slots=True)
class Taxonomy:
    """rules/taxonomy/taxonomy.yaml, checked."""

    layers: list[str]
    class_layer: dict[str, str]  # in triage order
    verify: dict[str, str]
    phases: tuple[str, ...]
    phase_label: dict[str, str]
    hang_budget_s: dict[str, int]
    waits_on: dict[str, str]
    oom_phases: tuple[str, ...]

    @property
    def class_order(self) -> list[str]:
        return list(self.class_layer)


def _need(cond: bool, path: str, ident: str | None, fld: str, problem: str) -> None:
    if not cond:
        raise RuleError(path, ident, fld, problem)


def _entries(data: dict[str, Any], key: str, path: str, needed: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """id → entry of a list of `{id: …, …}` mappings: ids present, none twice, the needed ones there."""
    raw = data.get(key)
    _need(isinstance(raw, list) and bool(raw), path, None, key, f"a list of {key}")
    out: dict[str, dict[str, Any]] = {}
    for e in raw:
        _need(
            isinstance(e, dict) and isinstance(e.get("id"), str),
            path,
            None,
            f"{key}[].id",
            "every entry needs an id",
        )
        _need(e["id"] not in out, path, e["id"], "id", "appears twice")
        out[e["id"]] = e
    for ident in needed:
        _need(ident in out, path, ident, "id", "the tool needs it")
    return out


def _text(entry: dict[str, Any], fld: str, path: str, problem: str) -> str:
    _need(isinstance(entry.get(fld), str) and bool(entry[fld]), path, entry["id"], fld, problem)
    return str(entry[fld])


def parse(data: Any, path: str) -> Taxonomy:
    """The taxonomy from the file's data, every field checked."""
    _need(isinstance(data, dict), path, None, "(file)", "must be a mapping")
    layers = data.get("layers")
    _need(
        isinstance(layers, list) and all(isinstance(x, str) for x in layers),
        path,
        None,
        "layers",
        "a list of names",
    )
    classes = _entries(data, "classes", path, ("unknown_error", "stop"))
    for cid, c in classes.items():
        _need(c.get("layer") in layers, path, cid, "layer", f"must be one of {', '.join(layers)}")
    verify = {cid: _text(c, "verify", path, "the check a change worked") for cid, c in classes.items()}
    phases = _entries(
        data,
        "phases",
        path,
        ("start", "args", "distributed_init", "load_weights", "weights_loaded", "ready", "serving"),
    )
    label = {pid: _text(p, "label", path, "how people read it") for pid, p in phases.items()}
    waiting = {pid: p for pid, p in phases.items() if pid not in ("ready", "serving")}  # nothing waits there
    for pid, p in waiting.items():
        _need(
            isinstance(p.get("hang_budget_s"), int) and p["hang_budget_s"] > 0,
            path,
            pid,
            "hang_budget_s",
            "seconds before a finished log stuck here is a hang",
        )
    waits = {pid: _text(p, "waits_on", path, "what the phase usually waits on") for pid, p in waiting.items()}
    oom = data.get("oom_phases")
    _need(
        isinstance(oom, list) and set(oom) == {"load", "startup", "runtime"},
        path,
        None,
        "oom_phases",
        "load, startup and runtime",
    )
    return Taxonomy(
        layers,
        {cid: c["layer"] for cid, c in classes.items()},
        verify,
        tuple(phases),
        label,
        {pid: p["hang_budget_s"] for pid, p in waiting.items()},
        waits,
        tuple(oom),
    )


def load(path: str | None = None) -> Taxonomy:
    """The shipped taxonomy (or the file given), validated once and then read from the cache."""
    from ..base.validated_cache import load_validated

    where = path or os.path.join(builtin_rules_dir(), "taxonomy", "taxonomy.yaml")
    return load_validated(where, lambda data, _trusted: parse(data, where))


TAXONOMY = load()
