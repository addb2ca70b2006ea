"""A diagnosis as JSON (schema 1, DESIGN.md): what tests and tools outside the project read."""

from __future__ import annotations

import json

from ..model.records import Diagnosis

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def render(d: Diagnosis, show_all: bool = False, chart: bool = False) -> str:
    """The JSON output (outputs.OUTPUTS["json"]); the options of the text output do not apply."""
    return json.dumps(finite(d.to_json()), indent=2, ensure_ascii=False, default=str)


def finite(v: Any) -> Any:
    """The value with infinities and NaN as strings: JSON has no such numbers (a launch dump or
    a command line may say `inf`)."""
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return str(v)
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [finite(x) for x in v]
    return v
