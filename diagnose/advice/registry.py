"""Advice's one entry: which value function answers each parameter and which handler each
failure class has, both listed here, and `advise` that runs them for one finding.

A class with no handler is advised from its rule's own list (`advice:` in the rule file), each
parameter through its value function or its constant text (rules/advice/advice.yaml): a class
added to the taxonomy and its rules needs no code here.
"""

from __future__ import annotations

from collections.abc import Callable

from ..knowledge.engine_profiles import Profiles
from ..model.records import Change, Finding
from . import environment, hang, memory, parallelism, port, request, weights
from .core import Advisor, Context, HostPorts, ValueFn
from .data import advice_data

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DOMAINS = (memory, parallelism, port, weights, environment, hang, request)


def _merged(attr: str) -> dict[str, Callable[[Advisor], None]]:
    out: dict[str, Callable[[Advisor], None]] = {}
    for domain in DOMAINS:
        for key, fn in getattr(domain, attr).items():
            if key in out:
                raise RuntimeError(
                    f"advice: {key!r} is answered by two domains"
                )  # a bug, caught by the suite
            out[key] = fn
    return out


VALUES: dict[str, ValueFn] = _merged("VALUES")  # canonical parameter -> its value function
CLASS_ADVICE: dict[str, Callable[[Advisor], None]] = _merged("CLASSES")  # failure class -> handler

# Changes that are not an engine setting: any engine can take them.
NOT_A_SETTING = ("model", "engine_version", "max_tokens", "shm_size")


def advise(
    finding: Finding | None,
    engine: str,
    launch: dict[str, Any],
    profiles: Profiles,
    rule: Any = None,
    frames: set[str] | None = None,
    observed: dict[str, Any] | None = None,
    device: dict[str, Any] | None = None,
    shape: Any = None,
    ports: HostPorts | None = None,
) -> list[Change]:
    if finding is None:
        return []
    ctx = Context(
        finding=finding,
        engine=engine,
        launch=launch,
        profiles=profiles,
        frames=frames or set(),
        observed=observed or {},
        rule=rule,
        device=device,
        shape=shape,
        ports=ports,
    )
    return fit_engine(_run(Advisor(ctx, VALUES, advice_data().constants)), engine, profiles)


def _run(a: Advisor) -> list[Change]:
    f = a.finding
    rule = a.ctx.rule
    subcause(a)
    # a rule that names values knows this message better than the class's defaults
    specific = rule is not None and any("to" in x for x in rule.advice)
    if specific:
        a.from_rule()
    setting = f.facts.get("setting")
    if setting and f.confidence in ("medium", "low"):
        a.value(str(setting))  # the launch setting the engine's own message names
    handler = CLASS_ADVICE.get(f.cls)
    if handler is not None:
        handler(a)
    if not a.complete and not specific:
        a.from_rule()
    return a.out


def subcause(a: Advisor) -> None:
    """The changes for what the failing message itself names, or the exception its traceback
    raised (rules/advice/advice.yaml `subcauses`), before the class's own list."""
    import re

    f = a.finding
    text = " ".join([f.evidence, f.raised or "", str(f.facts.get("vocabulary_term") or "")])
    for sc in advice_data().subcauses:
        if sc["class"] == f.cls and re.search(sc["pattern"], text):
            for change in sc["changes"]:
                before = len(a.out)
                if isinstance(change, dict):  # its own why says the sub-cause
                    a.add(change["param"], change["to"], change["why"], flag=change.get("flag"))
                    continue
                a.value(change)
                if len(a.out) > before:
                    a.out[-1].why = f"{a.out[-1].why} (the message names {sc['name']})"
            return


def fit_engine(changes: list[Change], engine: str, profiles: Profiles) -> list[Change]:
    """Only what the detected engine has, in its spelling. A log no engine claims is read with
    the generic profile (the seed guides' engine, a config file of a few keys): its own keys
    come first, the other changes follow under their canonical names, never another engine's
    flags."""
    flags = profiles.get(engine).flags

    def has(c: Change) -> bool:
        # a flag the engine's own message named (config) is the engine's by definition
        return (
            c.param in flags
            or c.param.startswith(("env:", "action:"))
            or c.param in NOT_A_SETTING
            or c.named_by_engine
        )

    if engine != "generic":
        return [c for c in changes if has(c)]
    for c in changes:
        if not has(c):
            c.flag = c.param  # the concept's name: no engine's flag is guessed
    return [c for c in changes if has(c)] + [c for c in changes if not has(c)]


def advise_incomplete(
    last_phase: str | None,
    engine: str,
    launch: dict[str, Any],
    profiles: Profiles,
    observed: dict[str, Any] | None = None,
    stopped: bool = False,
) -> list[Change]:
    """A log that ends mid-startup with no error: what to try if it stays in that phase (or
    what it waited on, when someone stopped it there)."""
    observed = observed or {}
    found = hang.stall(last_phase, launch, observed, stopped)
    if found is None:
        return []
    stall, label = found
    changes = advise(stall, engine, launch, profiles, observed=observed)
    for c in changes:
        c.why = f"if it stays in {label}: {c.why}"
    return changes
