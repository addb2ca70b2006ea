"""The value of a launch setting in force, one precedence for every caller: what the server was
launched with, then what the error itself said, then what the engine reported, then the
engine's profile default, then the generic profile's."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .engine_profiles import Profiles


def value_in_force(
    param: str,
    launch: dict[str, Any],
    profiles: Profiles,
    engine: str,
    facts: dict[str, Any] | None = None,
    observed: dict[str, Any] | None = None,
) -> Any:
    for said in (launch, facts or {}, observed or {}):
        if param in said:
            return said[param]
    prof = profiles.get(engine)
    if param in prof.defaults:
        return prof.defaults[param]
    return profiles.get("generic").defaults.get(param)


def default_of(param: str, profiles: Profiles, engine: str) -> Any:
    """The engine's default for a setting, else the generic profile's (None when neither says)."""
    prof = profiles.get(engine)
    if param in prof.defaults:
        return prof.defaults[param]
    return profiles.get("generic").defaults.get(param)
