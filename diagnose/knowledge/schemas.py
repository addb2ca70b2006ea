"""The shapes of the data files users write (rules), as JSON Schemas checked with the
`jsonschema` library, with errors said the tool's way: the file, the rule id and the field.

Only a file that changed since it last validated is checked (datacache): the library is
imported then, never on a scan of a known installation. A schema says what a field must be
in its own words (`x-problem`, `{value}` for the value found) so an error reads as the
user's mistake, not as the validator's vocabulary.
"""

from __future__ import annotations

from ..base.errors import RuleError
from ..model.records import CLASSES, OOM_PHASES, SEVERITIES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_NON_EMPTY_STRINGS = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "string", "minLength": 1},
}
_LOG_LINES = {**_NON_EMPTY_STRINGS, "x-problem": "must be a non-empty list of log lines"}


def rule_schema(layers: tuple[str, ...], id_pattern: str) -> dict[str, Any]:
    """One rule of a rules file (rules/*.yaml); `id_pattern`: what an id (and an engine name) is."""
    classes = sorted(CLASSES)
    return {
        "type": "object",
        "x-problem": "a rule must be a mapping",
        "required": ["id", "engines", "severity", "needles", "pattern", "title", "examples"],
        # an ignore rule explains a line away: it needs no class
        "if": {"properties": {"severity": {"const": "ignore"}}},
        "else": {"required": ["class"]},
        "additionalProperties": False,
        "properties": {
            "id": {
                "type": "string",
                "pattern": id_pattern,
                "x-problem": "must be lower-case words joined by . - or _",
            },
            "engines": {"type": "array", "minItems": 1, "x-problem": "must be a non-empty list"},
            "severity": {
                "enum": list(SEVERITIES),
                "x-problem": "{value} is not one of " + ", ".join(SEVERITIES),
            },
            "class": {
                "enum": classes,
                "x-problem": "{value} is not in the taxonomy (" + ", ".join(classes) + ")",
            },
            "needles": {**_NON_EMPTY_STRINGS, "x-problem": "must be a non-empty list of non-empty strings"},
            "pattern": {"type": "string", "minLength": 1, "x-problem": "must be a non-empty string"},
            "title": {"type": "string", "pattern": r"\S", "x-problem": "must be a non-empty string"},
            "why": {"type": ["string", "null"]},
            "examples": {
                "type": "object",
                "x-problem": "must be a mapping with 'match' and 'no_match'",
                "required": ["match", "no_match"],
                "additionalProperties": False,
                "properties": {"match": _LOG_LINES, "no_match": _LOG_LINES},
            },
            "advice": {
                "type": ["array", "null"],
                "x-problem": "must be a list",
                "items": {
                    "type": "object",
                    "required": ["param"],
                    "additionalProperties": False,
                    "properties": {"param": {"type": "string"}, "to": {}, "why": {"type": "string"}},
                    "x-problem": "each entry needs 'param' and may have 'to' and 'why'",
                },
            },
            "consequence": {"type": "boolean", "x-problem": "must be true or false"},
            "oom_phase": {"enum": [None, *OOM_PHASES], "x-problem": f"must be one of {OOM_PHASES}"},
            "wraps_phase": {
                "enum": [*OOM_PHASES, "method"],
                "x-problem": f"must be one of {[*OOM_PHASES, 'method']}",
            },
            "scope": {"enum": ["message", "text"], "x-problem": "must be 'message' or 'text'"},
            "layer": {"enum": list(layers), "x-problem": "must be one of " + ", ".join(layers)},
        },
    }


def incident_schema(known_keys: set[str]) -> dict[str, Any]:
    """One incident of a store (rules/kb/*.yaml, ~/.local/share/diagnose/kb)."""
    text = {"type": "string", "minLength": 1, "x-problem": "missing"}
    listed = {"type": "array", "x-problem": "must be a list"}
    classes = sorted(CLASSES)
    return {
        "type": "object",
        "x-problem": "an incident must be a YAML mapping",
        "required": ["id", "title", "date", "symptom", "root_cause"],
        "additionalProperties": False,
        "properties": {
            **{k: {} for k in sorted(known_keys)},
            "id": {"type": "string", "pattern": r"^KB-\d{4,}$", "x-problem": "{value} is not like KB-0001"},
            "title": text,
            "date": {"not": {"enum": [None, ""]}, "x-problem": "missing"},  # a YAML date or a string
            "root_cause": text,
            "symptom": {
                "type": "object",
                "x-problem": "must be a mapping (classes, rules, evidence)",
                "properties": {
                    "classes": {
                        "type": ["array", "null"],
                        "items": {
                            "enum": classes,
                            "x-problem": "{value} is not one of " + ", ".join(classes),
                        },
                        "x-problem": "must be a list of classes",
                    }
                },
            },
            "path": listed,
            "fix": listed,
            "tags": listed,
        },
    }


def marker_schema(what: str, phases: tuple[str, ...], launch_kinds: list[str]) -> dict[str, Any]:
    """One marker of an engine profile (detect, variants, version, phases, launch, observe)."""
    props: dict[str, Any] = {
        "needles": {**_NON_EMPTY_STRINGS, "x-problem": "must be a non-empty list of strings"},
        "pattern": {"type": "string", "minLength": 1, "x-problem": "missing"},
        "examples": {**_LOG_LINES},
        "phase": {},
        "weight": {"type": "integer", "x-problem": "must be a whole number"},
        "variant": {"type": ["string", "null"]},
        "kind": {},
        "why": {"type": ["string", "null"]},
        "repeat": {"type": "boolean", "x-problem": "must be true or false"},
        "library": {"type": "boolean", "x-problem": "must be true or false"},
        "own": {"type": "boolean", "x-problem": "must be true or false"},
    }
    required = ["needles", "pattern", "examples"]
    if what == "phases":
        props["phase"] = {"enum": list(phases), "x-problem": "{value} is not one of " + ", ".join(phases)}
        required.append("phase")
    if what == "launch":
        props["kind"] = {
            "enum": launch_kinds,
            "x-problem": "{value} is not one of " + ", ".join(launch_kinds),
        }
        required.append("kind")
    return {
        "type": "object",
        "x-problem": "must be a mapping",
        "required": required,
        "additionalProperties": False,
        "properties": props,
    }


def memory_schema(kv_budgets: list[str], choices: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """An engine profile's `memory` section: how it sizes memory (budget.EngineUnits)."""
    closed = {
        k: {"enum": list(v), "x-problem": "{value} is not one of " + ", ".join(v)} for k, v in choices.items()
    }
    return {
        "type": ["object", "null"],
        "x-problem": "must be a mapping",
        "additionalProperties": False,
        "properties": {
            "kv_budget": {"enum": kv_budgets, "x-problem": "{value} is not one of " + ", ".join(kv_budgets)},
            "package": {"type": "string", "minLength": 1, "x-problem": "must be a non-empty string"},
            "launch": {"type": "string", "pattern": "[{]model[}]", "x-problem": "must hold {model}"},
            "reserve_gib": {"type": "number", "exclusiveMinimum": 0, "x-problem": "must be a number of GiB"},
            **closed,
        },
    }


_VALIDATORS: dict[int, Any] = {}


def check(data: Any, schema: dict[str, Any], path: str, label: str | None, at: str = "") -> None:
    """Raise a RuleError naming the file, `label` (a rule id) and the field of the first problem
    (`at`: where `data` sits in its file, e.g. `memory`)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    validator = _VALIDATORS.get(id(schema))
    if validator is None:
        validator = _VALIDATORS[id(schema)] = Draft202012Validator(schema)
    error = best_match(validator.iter_errors(data))
    if error is None:
        return
    field, problem = _said(error)
    raise RuleError(path, label, ".".join(x for x in (at, field) if x) or None, problem)


def _said(error: Any) -> tuple[str | None, str]:
    """(the field, the problem) of a jsonschema error, in the schema's own words."""
    where = [str(p) for p in error.absolute_path if not isinstance(p, int)]  # a field, not an item
    if error.validator == "required":
        missing = next(p for p in error.validator_value if p not in error.instance)
        # inside a field, say what the missing part must be (examples.no_match: log lines)
        own = error.schema.get("properties", {}).get(missing, {}).get("x-problem") if where else None
        return ".".join([*where, missing]), f"missing ({own})" if own else "missing"
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in allowed)
        return ".".join([*where, str(extra[0])]), f"unknown key (allowed: {', '.join(allowed)})"
    own = error.schema.get("x-problem")
    problem = own.replace("{value}", repr(error.instance)) if own else error.message
    return (".".join(where) or None), problem
