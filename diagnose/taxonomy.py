"""The failure taxonomy (rules/taxonomy/taxonomy.yaml): layers, classes in triage order with their
verify texts, startup phases with their labels, hang budgets and what they wait on, and the
OOM phases. Read once per process, from the validated-data cache when the file is unchanged
(no YAML import on a scan); a file with a missing or wrong field is named (file, id, field)."""

from __future__ import annotations

import os

from .errors import RuleError
from .records import record
from .shipped import builtin_rules_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


@record
class Taxonomy:
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


def parse(data: Any, path: str) -> Taxonomy:
    """The taxonomy from the file's data, every field checked."""
    _need(isinstance(data, dict), path, None, "(file)", "must be a mapping")
    layers = data.get("layers")
    _need(isinstance(layers, list) and all(isinstance(x, str) for x in layers), path, None, "layers", "a list of names")
    class_layer: dict[str, str] = {}
    verify: dict[str, str] = {}
    classes = data.get("classes")
    _need(isinstance(classes, list) and bool(classes), path, None, "classes", "a list of classes")
    for c in classes:
        _need(isinstance(c, dict) and isinstance(c.get("id"), str), path, None, "classes[].id", "every class needs an id")
        cid = c["id"]
        _need(cid not in class_layer, path, cid, "id", "appears twice")
        _need(c.get("layer") in layers, path, cid, "layer", f"must be one of {', '.join(layers)}")
        _need(isinstance(c.get("verify"), str) and bool(c["verify"]), path, cid, "verify", "the check a change worked")
        class_layer[cid] = c["layer"]
        verify[cid] = c["verify"]
    for needed in ("unknown_error", "stop"):
        _need(needed in class_layer, path, needed, "id", "the tool needs this class")
    phases: list[str] = []
    label: dict[str, str] = {}
    budget: dict[str, int] = {}
    waits: dict[str, str] = {}
    raw_phases = data.get("phases")
    _need(isinstance(raw_phases, list) and bool(raw_phases), path, None, "phases", "a list of phases")
    for p in raw_phases:
        _need(isinstance(p, dict) and isinstance(p.get("id"), str), path, None, "phases[].id", "every phase needs an id")
        pid = p["id"]
        _need(pid not in label, path, pid, "id", "appears twice")
        _need(isinstance(p.get("label"), str) and bool(p["label"]), path, pid, "label", "how people read it")
        phases.append(pid)
        label[pid] = p["label"]
        if pid in ("ready", "serving"):
            continue  # nothing waits there: no budget
        _need(isinstance(p.get("hang_budget_s"), int) and p["hang_budget_s"] > 0, path, pid, "hang_budget_s",
              "seconds before a finished log stuck here is a hang")
        _need(isinstance(p.get("waits_on"), str) and bool(p["waits_on"]), path, pid, "waits_on",
              "what the phase usually waits on")
        budget[pid] = p["hang_budget_s"]
        waits[pid] = p["waits_on"]
    for needed in ("start", "args", "distributed_init", "load_weights", "weights_loaded", "ready", "serving"):
        _need(needed in label, path, needed, "id", "the matcher and triage need this phase")
    oom = data.get("oom_phases")
    _need(isinstance(oom, list) and set(oom) == {"load", "startup", "runtime"}, path, None, "oom_phases",
          "load, startup and runtime")
    return Taxonomy(layers, class_layer, verify, tuple(phases), label, budget, waits, tuple(oom))


def load(path: str | None = None) -> Taxonomy:
    """The shipped taxonomy (or the file given), validated once and then read from the cache."""
    from .datacache import data_cache

    path = path or os.path.join(builtin_rules_dir(), "taxonomy", "taxonomy.yaml")
    cache = data_cache()
    trusted, data = cache.get(path)
    if not trusted:
        import yaml

        try:
            with open(path, encoding="utf-8") as f:
                data = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except (OSError, yaml.YAMLError) as e:
            raise RuleError(path, None, "(file)", str(e).splitlines()[0]) from e
    tax = parse(data, path)
    if not trusted:
        cache.put(path, data)
        cache.save()
    return tax


TAXONOMY = load()
