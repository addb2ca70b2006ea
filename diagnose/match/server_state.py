"""What the engines' own markers say about the server as a log goes by: which engine (and
variant, version), the startup phases each run reached, the launch parameters it dumped and
the sizes and counts it reported. A phase marker of start or args after distributed init is
a restart: a new run begins.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from ..knowledge.engine_profiles import Marker
from ..model.records import PHASE_INDEX, Line, PhaseMark
from ..model.typed_facts import typed_facts
from ..read.launch_args import canonical_launch, parse_repr
from ..read.prefixes import Layout
from .candidates import Candidates

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..knowledge.engine_profiles import Profiles

ENGINE_MIN_SCORE = 5
ENGINE_DECIDED = 30  # detection evidence after which other engines' markers stop being searched
VARIANT_DECIDED = 20
MAX_DUMP_LINES = 400  # a multi-line launch dump ends here if its closing brace never comes


class ServerState:
    def __init__(self, profiles: Profiles, candidates: Candidates, forced_engine: str | None):
        self.profiles = profiles
        self.candidates = candidates
        self.forced_engine = forced_engine
        # the engine
        self.engine_scores: dict[str, int] = defaultdict(int)
        self.own_engines: set[str] = set()  # engines whose own entry point's line was seen
        self.decided: str | None = None  # the engine last decided (the others' markers retired)
        # active_engine() as last worked out (asked on every candidate line; evidence changes it)
        self._active: tuple[str | None] | None = None
        self.engine_reason: dict[str, str] = {}
        self._reason_weight: dict[str, int] = {}
        self.variant_scores: dict[str, int] = defaultdict(int)
        self.version: str | None = None
        self.version_engine: str | None = None
        # the runs and their phases
        self.run = 0
        self.timeline: list[PhaseMark] = []
        self.reached: set[str] = set()
        self.current_phase: str | None = None
        self.phase_last_line: dict[str, int] = {}
        self.run_start_line = 0
        # what it said about itself
        self.launch_raw: dict[str, dict[str, Any]] = defaultdict(dict)
        self.observed: dict[str, Any] = {}
        self.observed_where: dict[str, tuple[int, str]] = {}  # the line each value was last read from
        self.observed_before: list[tuple[int, dict[str, Any]]] = []
        self.collecting: tuple[Marker, list[str], int] | None = None  # a multi-line launch dump

    # --- the engine --------------------------------------------------------------------------

    def active_engine(self) -> str | None:
        if self._active is None:
            self._active = (self._active_now(),)
        return self._active[0]

    def _active_now(self) -> str | None:
        if self.forced_engine:
            return self.forced_engine
        if not self.engine_scores:
            return None
        best = max(self._contenders().items(), key=lambda kv: kv[1])
        return best[0] if best[1] >= ENGINE_MIN_SCORE else None

    def _contenders(self) -> dict[str, int]:
        """The engines that can be the server: those whose own entry point spoke, when one did
        (SGLang imports vLLM's platform detection and prints vLLM's frames; its ServerArgs is
        its own), else every engine with evidence."""
        own = self.own_engines
        return {e: v for e, v in self.engine_scores.items() if e in own} if own else self.engine_scores

    def evidence(self, engine: str, weight: int, line: Line, own: bool = False) -> None:
        self._active = None
        self.engine_scores[engine] += weight
        first_own = own and engine not in self.own_engines
        if first_own:
            self.own_engines.add(engine)
        if own and self.decided and engine != self.decided:
            # another engine's own line after the decision is said once: its markers retire (their
            # needles, frequent in that engine's log, would otherwise be read to the end)
            self.candidates.retire_markers(
                ("own line seen", engine), lambda x, e=engine: x.what == "detect" and x.engine == e
            )
        self._maybe_decide_engine()
        # the report names the engine by its own line, else by the strongest evidence seen
        if first_own or (engine not in self.own_engines and weight > self._reason_weight.get(engine, 0)):
            self._reason_weight[engine] = weight
            shown = (line.message.strip() or line.text.strip())[:120]
            self.engine_reason[engine] = f"{line.source}:{line.number}: {shown}"

    def _maybe_decide_engine(self) -> None:
        if self.forced_engine:
            return
        ranked = sorted(self._contenders().values(), reverse=True)
        if (
            ranked[0] >= ENGINE_DECIDED
            and ranked[0] - (ranked[1] if len(ranked) > 1 else 0) >= ENGINE_DECIDED // 2
        ):
            engine = self.decided = self.active_engine()
            # another engine's own line stays searched: seen, it means two servers in one log
            self.candidates.retire_markers(
                ("decided", engine),
                lambda x: (
                    not (x.what == "detect" and x.own and x.engine != engine)
                    and (
                        x.what == "detect"
                        or (
                            x.engine != engine
                            and not (x.engine == "generic" and (x.what == "observe" or x.library))
                        )
                    )
                ),
            )

    # --- one marker ----------------------------------------------------------------------------

    def marker(self, mk: Marker, line: Line, engine: str | None) -> str | None:
        """Read one marker on its line; the phase it marks, when it marks one."""
        what = mk.what
        if what == "detect":
            if mk.search(line.text):
                self.evidence(mk.engine, mk.weight, line, mk.own)
            return None
        # generic observations (CUDA_VISIBLE_DEVICES) and runtime libraries' lines (NCCL): any engine
        shared = mk.engine == "generic" and (what == "observe" or mk.library)
        if engine is not None and mk.engine != engine and not shared:
            return None
        if (
            engine is None
            and mk.engine == "generic"
            and what == "phases"
            and self.engine_scores
            and not shared
        ):
            # an engine is half-detected: its own markers are better than the generic guesses
            return None
        m = mk.search(mk.target(line))
        if m is None:
            return None
        if what == "phases":
            return mk.phase or ""
        if what == "variants":
            key = f"{mk.engine}/{mk.variant or ''}"  # a variant is its engine's (vLLM's v0/v1)
            self.variant_scores[key] += mk.weight
            if max(self.variant_scores.values()) >= VARIANT_DECIDED:
                self.candidates.retire_markers("variants", lambda x: x.what == "variants")
        elif what == "version" and self.version is None:
            self.version = m.group("version")
            self.version_engine = mk.engine
            self.candidates.retire_markers("version", lambda x: x.what == "version")
        elif what == "observe":
            # sizes and counts the engine reports (KV tokens, running requests, usage): latest wins
            self._observe(typed_facts(m.groupdict()), line.number, line.message)
            if not mk.repeat:
                self.candidates.retire(mk)  # said once per start (revived on a restart)
        elif what == "launch":
            text = m.groupdict().get("repr") or ""
            if mk.kind == "rust_debug" and text.rstrip().endswith("{"):
                self.collecting = (mk, [text], 0)
            else:
                self.launch_raw[mk.engine].update(parse_repr(mk.kind or "", text))
        return None

    def _observe(self, facts: dict[str, Any], number: int, message: str) -> None:
        # a group `env__NAME` reads an environment setting the line shows in force: `env:NAME`
        facts = {f"env:{k[5:]}" if k.startswith("env__") else k: v for k, v in facts.items()}
        self.observed.update(facts)
        for k in facts:
            self.observed_where[k] = (number, message.strip()[:300])

    def collect(self, line: Line) -> None:
        """One more line of a multi-line launch dump (TGI's pretty-printed Args { … })."""
        assert self.collecting is not None
        mk, parts, count = self.collecting
        parts.append(line.message.strip())
        count += 1
        if line.message.strip() in ("}", "},") or count > MAX_DUMP_LINES:
            self.collecting = None
            self.launch_raw[mk.engine].update(parse_repr(mk.kind or "", " ".join(parts)))
        else:
            self.collecting = (mk, parts, count)

    def read_observed(self, layout: Layout, source: str) -> None:
        """Read the stats lines the candidates kept as bytes (only the latest of each kind)."""
        c = self.candidates
        for (number, raw), found in sorted((v, k) for k, v in c.latest_observed.items()):
            line = layout.line(source, number, raw)
            for needle in found:
                for mk in c.by_needle[needle]:
                    m = mk.search(mk.target(line)) if id(mk) not in c.retired else None
                    if m is not None:
                        self._observe(typed_facts(m.groupdict()), number, line.message)
        c.latest_observed = {}

    # --- phases and runs ---------------------------------------------------------------------------

    def restarts(self, phase: str) -> bool:
        """Does this phase begin a new run (the server started again)?"""
        cur = PHASE_INDEX[self.current_phase] if self.current_phase else -1
        return phase in ("start", "args") and cur >= PHASE_INDEX["distributed_init"]

    def new_run(self, line_number: int) -> None:
        if len(self.observed_before) < 64:
            self.observed_before.append((line_number, dict(self.observed)))
        self.run += 1
        self.timeline = []
        self.reached = set()
        self.current_phase = None
        self.phase_last_line = {}
        self.run_start_line = line_number
        self.candidates.revive_phases()

    def reach(self, phase: str, line: Line, when: Callable[[], str | None]) -> bool:
        """The phase marked on this line; whether it is reached for the first time in this run
        (`when`: the line's time, or that of the lines before it)."""
        self.phase_last_line[phase] = line.number
        if phase in self.reached:
            return False
        self.reached.add(phase)
        if phase not in ("start", "args"):  # those two must stay: they reveal a restart
            self.candidates.retire_phase(phase)
        self.timeline.append(PhaseMark(phase, line.number, when(), line.source, line.message[:200]))
        cur = PHASE_INDEX[self.current_phase] if self.current_phase else -1
        if PHASE_INDEX[phase] > cur:
            self.current_phase = phase
        return True

    def launch(self) -> dict[str, Any]:
        """The launch parameters in canonical names: generic dumps first, the detected engine's win."""
        engine = self.active_engine()
        names: dict[str, str] = {}
        for prof in self.profiles.by_engine.values():
            names.update(prof.names)
        if engine:
            names.update(self.profiles.get(engine).names)
        out: dict[str, Any] = {}
        for e in sorted(self.launch_raw, key=lambda e: (e == engine, e != "generic")):
            out.update(canonical_launch(self.launch_raw[e], names))
        return out

    def result_fields(self) -> dict[str, Any]:
        """Its part of a ScanResult."""
        return {
            "timeline": list(self.timeline),
            "earlier_runs": self.run,
            "engine_scores": dict(self._contenders()),  # an engine's own line outranks imported ones
            "engine_reason": self.engine_reason,
            "own_engines": sorted(self.own_engines),
            "variant_scores": dict(self.variant_scores),
            "version": self.version,
            "launch": self.launch(),
            "phase_last_line": dict(self.phase_last_line),
            "run_start_line": self.run_start_line,
            "observed": dict(self.observed),
            "observed_where": dict(self.observed_where),
            "observed_before": list(self.observed_before),
        }
