"""What a scan knows before it reads a line: the rules and the engine profiles, loaded once
per process."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..base.errors import InputError
from .engine_profiles import Profiles, load_profiles
from .rules import RuleSet, load_rules


@dataclass(slots=True)
class Knowledge:
    """Rules and engine profiles, loaded once per process."""

    rules: RuleSet
    profiles: Profiles
    problems: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, extra_dirs: list[str] | None = None) -> Knowledge:
        profiles = load_profiles(extra_dirs)
        rules = load_rules(extra_dirs, known_engines=set(profiles.by_engine), layout=profiles.layout)
        if not rules.rules:
            raise InputError(
                "no usable rules: " + ("; ".join(rules.problems) or "the rules directory is empty")
            )
        return cls(rules, profiles, rules.problems + profiles.problems)

    @property
    def engines(self) -> list[str]:
        """The engines this installation knows: one per profile (rules/engines/*.yaml)."""
        return sorted(self.profiles.by_engine)

    def check_engine(self, engine: str | None) -> None:
        if engine is not None and engine not in self.profiles.by_engine:
            raise InputError(f"unknown engine {engine!r} (known: {', '.join(self.engines)})")
