"""Where the data shipped with the tool lies (rules, profiles, incidents, mined knowledge)."""

from __future__ import annotations

import os


def builtin_rules_dir() -> str:
    """rules/ inside the installed package (the wheel ships it there), or at the top of the source tree."""
    here = os.path.dirname(os.path.realpath(__file__))
    packaged = os.path.join(here, "rules")
    return packaged if os.path.isdir(packaged) else os.path.join(os.path.dirname(here), "rules")
