"""rules/advice/advice.yaml: the default steps per situation and the constant changes, read
once per process (from the validated-data cache when unchanged); a wrong field is named."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..base.data_files import builtin_rules_dir
from ..base.errors import RuleError
from ..model.canonical_params import ADVICE_SITUATIONS as SITUATIONS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


@dataclass(slots=True)
class AdviceData:
    """rules/advice/advice.yaml, checked."""

    steps: dict[str, list[dict[str, Any]]]  # situation -> ordered {param, note?, above?}
    constants: dict[str, dict[str, Any]]  # param -> {to, why, from?}
    subcauses: list[dict[str, Any]]  # {class, name, pattern, changes}: what the message names


def _need(cond: bool, path: str, fld: str, problem: str) -> None:
    if not cond:
        raise RuleError(path, None, fld, problem)


def parse(data: Any, path: str) -> AdviceData:
    _need(isinstance(data, dict), path, "(file)", "must be a mapping")
    steps = data.get("steps")
    _need(isinstance(steps, dict), path, "steps", "a mapping of situation to a list of steps")
    for key in SITUATIONS:
        _need(key in steps, path, f"steps.{key}", "missing")
    for key, items in steps.items():
        _need(key in SITUATIONS, path, f"steps.{key}", f"unknown situation (known: {', '.join(SITUATIONS)})")
        _need(isinstance(items, list) and bool(items), path, f"steps.{key}", "a non-empty list")
        for i, st in enumerate(items):
            _need(
                isinstance(st, dict) and isinstance(st.get("param"), str),
                path,
                f"steps.{key}[{i}].param",
                "missing",
            )
            _need(
                set(st) <= {"param", "note", "above"},
                path,
                f"steps.{key}[{i}]",
                "only param, note and above",
            )
    constants = data.get("constants")
    _need(isinstance(constants, dict), path, "constants", "a mapping of parameter to {to, why}")
    for param, c in constants.items():
        _need(isinstance(c, dict), path, f"constants.{param}", "a mapping {to, why, from}")
        _need(isinstance(c.get("to"), (str, int, float)), path, f"constants.{param}.to", "missing")
        _need(isinstance(c.get("why"), str) and bool(c["why"]), path, f"constants.{param}.why", "missing")
        _need(set(c) <= {"to", "why", "from"}, path, f"constants.{param}", "only to, why and from")
    return AdviceData(steps, constants, _subcauses(data.get("subcauses") or [], constants, path))


def _subcauses(items: Any, constants: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """The sub-causes a failing message names, checked: a known class, a pattern that compiles,
    changes that are constants or computed."""
    import re

    from ..model.canonical_params import COMPUTED_PARAMS, param_problem
    from ..model.taxonomy import TAXONOMY

    _need(isinstance(items, list), path, "subcauses", "a list of {class, name, pattern, changes}")
    for i, sc in enumerate(items):
        at = f"subcauses[{i}]"
        _need(
            isinstance(sc, dict) and set(sc) == {"class", "name", "pattern", "changes"},
            path,
            at,
            "exactly class, name, pattern and changes",
        )
        _need(sc["class"] in TAXONOMY.class_layer, path, f"{at}.class", f"unknown class {sc['class']!r}")
        try:
            re.compile(sc["pattern"])
        except (re.error, TypeError) as e:
            _need(False, path, f"{at}.pattern", f"does not compile: {e}")
        changes = sc["changes"]
        _need(isinstance(changes, list) and bool(changes), path, f"{at}.changes", "a non-empty list")
        for change in changes:
            if isinstance(change, dict):  # a change with its own value: {param, to, why}
                _need(
                    {"param", "to", "why"} <= set(change) <= {"param", "to", "why", "flag"},
                    path,
                    f"{at}.changes",
                    "{param, to, why} and maybe flag",
                )
                problem = param_problem(str(change["param"]), True)
                _need(problem is None, path, f"{at}.changes", str(problem))
                continue
            _need(
                change in constants or change in COMPUTED_PARAMS,
                path,
                f"{at}.changes",
                f"{change!r} has no constant and nothing computes it",
            )
    return list(items)


_DATA: AdviceData | None = None


def advice_data(path: str | None = None) -> AdviceData:
    """The shipped advice data (or the file given)."""
    global _DATA
    if path is not None:
        from ..base.validated_cache import load_yaml

        return parse(load_yaml(path), path)
    if _DATA is None:
        from ..base.validated_cache import load_validated

        where = os.path.join(builtin_rules_dir(), "advice", "advice.yaml")
        _DATA = load_validated(where, lambda data, _trusted: parse(data, where))
    return _DATA
