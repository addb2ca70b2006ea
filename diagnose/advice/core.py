"""What every piece of advice shares: the context of one finding, the list of changes being
built, and the grids values are picked on.

One change at a time (seed 003): the first Change is the one to make; the rest are ranked
alternatives. Values are ones a careful operator would pick: utilisation on a 0.05 grid and
never above 0.95, context lengths on a 1024 grid at or below what the KV cache holds,
parallel sizes that divide the heads and fit the GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..knowledge.engine_profiles import Profiles, flag_for
from ..knowledge.settings_in_force import default_of, value_in_force
from ..model.canonical_params import fill_template
from ..model.records import Change, Finding
from ..model.taxonomy import TAXONOMY
from ..model.typed_facts import as_float, as_int

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

UTIL_STEP = 0.05
UTIL_MAX = 0.95
VERIFY = TAXONOMY.verify  # the check that a change worked, per class (rules/taxonomy/taxonomy.yaml)


@dataclass(slots=True)
class HostPorts:
    """What the host said about a taken port, asked once by the pipeline (never mid-advice)."""

    holder: tuple[int, str] | None = None  # pid and command line listening on the port
    free_after: int | None = None  # the first free port above it
    free_rendezvous: int | None = None  # a free port for torch's rendezvous (from 29600)


@dataclass(slots=True)
class Context:
    """What advice knows of one finding: the engine, its launch, what it reported, the host."""

    finding: Finding
    engine: str
    launch: dict[str, Any]
    profiles: Profiles
    frames: set[str] = field(default_factory=set)
    observed: dict[str, Any] = field(default_factory=dict)  # what the engine reported
    rule: Any = None
    device: dict[str, Any] | None = None  # the GPU snapshot (JSON form), when given
    shape: Any = None  # budget.ModelShape from --config, when given
    ports: HostPorts | None = None  # for a port_in_use finding

    @property
    def visible_gpus(self) -> int | None:
        return self.device["count"] if self.device else None

    @property
    def idle_gpus(self) -> list[int]:
        if not self.device:
            return []
        return [g["index"] for g in self.device["gpus"] if (g.get("memory_used_mib") or 0) <= 1024]

    def current(self, param: str) -> Any:
        """The value in force: launched with, said by the error, reported, else the default."""
        return value_in_force(
            param, self.launch, self.profiles, self.engine, self.finding.facts, self.observed
        )


# --- grids ---------------------------------------------------------------------------------


def fmt_util(x: float) -> str:
    return f"{x:.2f}"


def util_down(x: float) -> float:
    """The next 0.05 step strictly below x."""
    return round(math.floor((x - 1e-9) / UTIL_STEP) * UTIL_STEP, 2)


def util_up(x: float) -> float | None:
    up = round(math.floor(x / UTIL_STEP + 1 + 1e-9) * UTIL_STEP, 2)
    return up if up <= UTIL_MAX and up > x else None


def len_down(n: int) -> int:
    """A context length at or below n: a round one (2^k or 3·2^k) within 10 %, else n on a 1024 grid."""
    if n < 1024:
        return max(256, n // 256 * 256)
    round_lens = sorted({m * 2**k for k in range(10, 25) for m in (1, 3)})
    best = max((x for x in round_lens if x <= n), default=0)
    if best >= 0.9 * n:
        return best
    return n // 1024 * 1024


def len_up(n: int) -> int:
    """The smallest round context length (2^k or 3·2^k, at least 1024) at or above n."""
    return min(x for x in (m * 2**k for k in range(10, 26) for m in (1, 3)) if x >= n)


def power_of_two_at_most(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def divisors_at_most(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def filled(template: str, facts: dict[str, Any]) -> str | None:
    """The template with the finding's facts, or None when the line did not carry them."""
    try:
        return fill_template(template, facts)
    except (KeyError, ValueError):
        return None


# --- the changes being built ---------------------------------------------------------------

ValueFn = Callable[["Advisor"], None]


class Advisor:
    """The changes for one finding, in order. `value(param)` asks the registry's value
    function for a parameter (or its constant text); the class handlers call it."""

    def __init__(self, ctx: Context, values: dict[str, ValueFn], constants: dict[str, dict[str, Any]]):
        self.ctx = ctx
        self.out: list[Change] = []
        self.complete = False  # the class logic knows better than the rule's generic list
        self.note: str | None = None  # the engine table's word on the step being added
        self._values = values
        self._constants = constants

    @property
    def finding(self) -> Finding:
        return self.ctx.finding

    def add(self, param: str, to: Any, why: str, frm: Any = None, flag: str | None = None) -> None:
        if to is None or any(c.param == param for c in self.out):
            return
        in_force = self.ctx.current(param) if param.startswith("env:") else frm
        if in_force is not None and str(in_force).lower() == str(to).lower():
            return  # the log shows it already set so: not a change
        if self.note:
            why = f"{why}; {self.note}" if self.note[0].isupper() else f"{why} {self.note}"
        fl = flag or flag_for(self.ctx.profiles, self.ctx.engine, param)
        to_s = to if isinstance(to, str) else (fmt_util(to) if isinstance(to, float) else str(to))
        if param.startswith("env:"):
            fl = f"{param[4:]}={to_s}"
        elif param == "shm_size":
            fl = f"--shm-size {to_s}"
        elif fl.startswith("env:"):
            fl = f"{fl[4:]}={to_s}"
        frm_s = None if frm is None else (fmt_util(frm) if isinstance(frm, float) else str(frm))
        verify = VERIFY.get(self.finding.cls, VERIFY["unknown_error"])
        self.out.append(Change(param=param, flag=fl, frm=frm_s, to=to_s, why=why, verify=verify))

    def value(self, param: str) -> None:
        """The change of one parameter, its value computed (or its constant text)."""
        fn = self._values.get(param)
        if fn is not None:
            fn(self)
            return
        const = self._constants.get(param)
        if const is not None:
            frm = self.ctx.current(param) if const.get("from") == "current" else const.get("from")
            self.add(param, const["to"], const["why"], frm)
        elif param.startswith("env:"):
            self.add(param, "1", f"see `diagnose rules show {self.finding.rule}`")

    def from_rule(self) -> None:
        """The rule's own suggestions, for anything the class logic did not cover."""
        rule = self.ctx.rule
        facts = self.finding.facts
        for a in rule.advice if rule is not None else []:
            param = a["param"]
            to = a.get("to")
            if to is not None:
                try:
                    to = fill_template(str(to), facts)
                    why = fill_template(str(a.get("why") or rule.title), facts)
                except (KeyError, ValueError):
                    continue  # the line did not carry that number: the next candidate says more
                self.add(param, to, why, self.ctx.current(param))
            else:
                before = len(self.out)
                self.value(param)
                if a.get("why") and len(self.out) > before and self.out[-1].param == param:
                    # the rule knows why this change helps here better than the class does
                    self.out[-1].why = filled(str(a["why"]), facts) or self.out[-1].why

    # --- small steps the domains share -----------------------------------------------------

    def has(self, param: str) -> bool:
        """Does the detected engine have this setting at all (its profile spells it)?"""
        return param in self.ctx.profiles.get(self.ctx.engine).flags

    def unit(self, param: str) -> str:
        """What the value means on this engine, when it is not vLLM's share of total memory."""
        u = self.ctx.profiles.get(self.ctx.engine).units.get(param)
        return f" (here the value is {u})" if u else ""

    def util_now(self) -> float:
        """The memory share in force (the engine's default when the log does not say it)."""
        said = as_float(self.ctx.current("gpu_memory_utilization"))
        return (
            said if said else float(default_of("gpu_memory_utilization", self.ctx.profiles, self.ctx.engine))
        )

    def util_lower(self, why_extra: str = "") -> None:
        f = self.finding
        cur = self.util_now()
        to = min(util_down(cur), UTIL_MAX)
        other, total = as_float(f.facts.get("other_gib")), as_float(f.facts.get("total_gib"))
        if other and total and other < total:
            # another process holds `other` GiB: only a budget within what is left can start
            to = min(to, math.floor((total - other) / total / UTIL_STEP) * UTIL_STEP)
        if to <= 0.3:
            return  # the GPU is taken or nearly so: a smaller budget is no fix
        if self._cut_starves_kv(cur - to, total):
            return
        self.add(
            "gpu_memory_utilization",
            to,
            f"leaves {round((cur - to) * 100)} % more of the GPU outside the engine's budget{why_extra}"
            + self.unit("gpu_memory_utilization"),
            cur,
        )

    def _cut_starves_kv(self, share: float, total: float | None) -> bool:
        """Would a utilisation cut of `share` leave a KV cache the log sized too small for one
        request of max_model_len? Read from the engine's own numbers: the KV memory and tokens
        it reported, the GPU's size, or (its size unknown) the CUDA graphs' estimate the cut
        would have to free."""
        obs = self.ctx.observed
        kv_gib, kv_tokens = as_float(obs.get("kv_avail_gib")), as_int(obs.get("kv_tokens"))
        max_len = as_int(self.ctx.current("max_model_len"))
        if not (kv_gib and kv_tokens and kv_tokens > 0 and max_len):
            return False
        spare = kv_gib - kv_gib / kv_tokens * max_len  # what the KV cache holds beyond one request
        total = total or as_float(obs.get("gpu_total_gib"))
        needed = share * total if total else as_float(obs.get("cuda_graph_gib"))
        return needed is not None and needed > spare

    def util_raise(self, why: str) -> bool:
        cur = self.util_now()
        to = util_up(cur)
        if to is None:
            return False
        self.add("gpu_memory_utilization", to, why + self.unit("gpu_memory_utilization"), cur)
        return True

    def halve(self, param: str, default: int, why: str, floor: int = 1) -> None:
        cur = as_int(self.ctx.current(param)) or default
        to = max(floor, cur // 2)
        if to < cur:
            self.add(param, to, why, cur)
