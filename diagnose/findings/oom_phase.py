"""When an OOM happened: load, startup (after the weights) or runtime, from the phase markers
before it, the frames of its traceback and how long the server had been up.
"""

from __future__ import annotations

from ..knowledge.engine_profiles import Profiles
from ..match.hitbook import RecordedHit
from ..match.scanner import ScanResult
from ..model.records import PHASE_INDEX
from ..model.taxonomy import TAXONOMY
from ..read.clock import seconds
from . import from_sources

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from ..model.records import Line


CONTEXT_AFTER = 60  # lines after an error whose context still tells its phase
RUNTIME_AFTER_READY_S = 1800  # an OOM this long after ready is a runtime OOM even without stats


def frames_of(rec: RecordedHit) -> list[str]:
    out: list[str] = []
    loc = rec.hit.line.location
    if loc:
        out.append(loc.rsplit("/", 1)[-1].split(":", 1)[0].removesuffix(".py"))
    for tb in (rec.tb, rec.near_tb):
        if tb is not None:
            out.extend(tb.frames)
            if tb.exception is not None and tb.exception.location:
                out.append(tb.exception.location.split(":", 1)[0].removesuffix(".py"))
    return out


def stack_phase(frames: list[str], profiles: Profiles, engine: str) -> tuple[str, str] | None:
    """(phase, the frame that tells it) from the stack hints: the first tier with a frame wins."""
    names = set(frames)
    if not names:
        return None
    hints = list(profiles.get(engine).stack_hints) if engine != "generic" else []
    hints += profiles.get("generic").stack_hints
    for phase, tokens in hints:
        hit = next((f for f in frames if f in tokens), None)
        if hit is not None:
            return phase, hit
    return None


def _phase_from_marks(phase: str | None) -> str | None:
    if phase is None:
        return None
    idx = PHASE_INDEX[phase]
    if idx >= PHASE_INDEX["serving"]:
        return "runtime"
    if idx >= PHASE_INDEX["weights_loaded"]:
        return "startup"
    if phase == "load_weights":
        return "load"
    return None


def uptime(rec: RecordedHit, result: ScanResult) -> int | None:
    """Seconds from ready to this hit, when the log's clock tells."""
    ready_t = next((seconds(m.time) for m in result.timeline if m.phase == "ready"), None)
    now = seconds(rec.hit.line.timestamp or rec.last_time)
    if ready_t is None or now is None or now < ready_t:
        return None
    return int(now - ready_t)


def _mark_line(result: ScanResult, phase: str, before: int) -> str:
    """ " (line N)" of the phase's mark before this line, or "" (an earlier run's timeline is
    gone once the server restarted)."""
    lines = [m.line for m in result.timeline if m.phase == phase and m.line <= before]
    return f" (line {lines[-1]})" if lines else ""


def oom_phase(
    rec: RecordedHit, cls: str, result: ScanResult, profiles: Profiles, engine: str
) -> tuple[str, str | None, str]:
    """(phase, how it was inferred: None for the timeline, or 'stack'/'message'/'context'/
    'default', and the evidence that decided it, in words)."""
    at = rec.hit.line.number
    if cls == "kv_cache_too_small":
        return "startup", None, "the KV cache is sized after the weights load"
    reached = rec.reached
    if "serving" in reached:
        return "runtime", None, f"requests were being served{_mark_line(result, 'serving', at)}"
    if "ready" in reached:
        up = uptime(rec, result)
        ready_at = _mark_line(result, "ready", at)
        if up is not None and up > RUNTIME_AFTER_READY_S:
            return "runtime", None, f"{up} s after the server became ready{ready_at}"
        return "startup", None, f"right after the server became ready{ready_at}, before serving"
    from_marks = _phase_from_marks(rec.phase_at)
    if from_marks and rec.phase_at:
        where = _mark_line(result, rec.phase_at, at)
        label = TAXONOMY.phase_label.get(rec.phase_at, rec.phase_at)
        return from_marks, None, f"the startup timeline: during {label}{where}"
    st = stack_phase(frames_of(rec), profiles, engine)
    if st:
        return st[0], "stack", f"the stack: frame {st[1]}"
    mined = from_sources.stack_phase(_tb_frames(rec), engine)
    if mined:
        return (
            mined[0],
            "stack",
            (
                f"the stack: frame {mined[1]}, which only the {mined[0]} call tree of {engine}'s source reaches"
            ),
        )
    wrapped = wrapped_step(rec, result, engine)
    if wrapped:
        return wrapped[0], "context", wrapped[1]
    if rec.rule is not None and rec.rule.oom_phase:
        return rec.rule.oom_phase, "message", f"the message itself ({rec.rule.id})"
    said = from_sources.message_phase(evidence_lines(rec), engine)
    if said:
        return said[0], "message", f"the message: {engine} prints it from {said[1]}"
    if rec.phase_at is None and _server_was_up_after(rec, result):
        return "runtime", "context", "the HTTP server shut down cleanly after it, so it had been up"
    ctx = _phase_from_marks(rec.phase_after)
    if ctx:
        return ctx, "context", f"the next startup line after it is {rec.phase_after}"
    if rec.phase_at is not None:
        # before weights started loading: CUDA context, NCCL buffers, model construction
        return "load", None, f"the startup timeline: before the weights loaded ({rec.phase_at})"
    return "startup", "default", "assumed: the log has no timeline, telling stack or context"


def _tb_frames(rec: RecordedHit) -> list[str]:
    """Function and file stem pairs, outermost first, of the hit's traceback."""
    for tb in (rec.tb, rec.near_tb):
        if tb is not None and tb.frames:
            return tb.frames
    return []


def evidence_lines(rec: RecordedHit) -> list[Line]:
    """The hit's line and its traceback's exception line."""
    lines = [rec.hit.line]
    for tb in (rec.tb, rec.near_tb):
        if tb is not None and tb.exception is not None and tb.exception is not rec.hit.line:
            lines.append(tb.exception)
    return lines


APP_SHUTDOWN_RULE = "uvicorn.app-shutdown"


def _server_was_up_after(rec: RecordedHit, result: ScanResult) -> bool:
    """The HTTP server shut down cleanly right after the error: it had completed its startup,
    so a log cut before any startup line was serving when the error came."""
    line = rec.hit.line
    return any(
        h.hit.rule_id == APP_SHUTDOWN_RULE
        and h.hit.line.source == line.source
        and 0 < h.hit.line.number - line.number <= CONTEXT_AFTER
        for h in result.hits
    )


def wrapped_step(rec: RecordedHit, result: ScanResult, engine: str) -> tuple[str, str] | None:
    """(phase, evidence) from a wrapper line that names the step its process failed in (a rule
    with `wraps_phase`): after the failure on its source, or in the same second (a sibling
    rank's report of the same event: the processes of one executor fail together)."""
    line = rec.hit.line
    when = line.timestamp
    for h in result.hits:
        rule, w = h.rule, h.hit.line
        if rule is None or rule.wraps_phase is None or w.source != line.source:
            continue
        near = 0 <= w.number - line.number <= CONTEXT_AFTER
        if not (near or (when is not None and w.timestamp == when)):
            continue
        phase: str | None = rule.wraps_phase
        said = f"line {w.number}: {w.message.strip()[:120]}"
        if phase == "method":
            method = h.hit.facts.get("method")
            phase = from_sources.function_phase(str(method), engine) if method else None
            if phase is None:
                continue
            said += f" ({method}: the {phase} call tree of {engine}'s source)"
        return phase, f"the wrapper names the step that failed, {said}"
    return None
