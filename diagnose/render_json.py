"""A diagnosis as JSON (schema 1, DESIGN.md): what tests and tools outside the project read."""

from __future__ import annotations

import json

from .model import Diagnosis


def render(d: Diagnosis, show_all: bool = False, chart: bool = False) -> str:
    """The JSON output (outputs.OUTPUTS["json"]); the options of the text output do not apply."""
    return json.dumps(d.to_json(), indent=2, ensure_ascii=False, default=str)
