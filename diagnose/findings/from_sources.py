"""What the engines' own sources say about a finding no rule explains (rules/mined, read
through `mined.py`): the template behind its line and the class it gives, the class table read
on an exception no template knows, and the OOM phase from the mined call trees or from the
function (or module) that prints the message. Triage asks; nothing here reads the log."""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..knowledge.mined import Match
    from ..model.records import Finding, Line


def stack_phase(frames: list[str], engine: str) -> tuple[str, str] | None:
    """(phase, frame) from the mined call trees, for a traceback's frames (function and file
    stem pairs, outermost first)."""
    if not frames:
        return None
    from ..knowledge.mined import knowledge

    return knowledge().frame_phase(frames, engine)


def function_phase(function: str, engine: str) -> str | None:
    """The phase of a function a wrapper names (a worker's RPC), from the engine's call-tree roots."""
    from ..knowledge.mined import knowledge

    return knowledge().function_phase(function, engine)


def template_for(lines: list[Line], engine: str) -> Match | None:
    """The mined template that best explains an error no rule knows: the most specific one
    (the engine's own before relayed ones, then the longest literal), an error template before
    one the engine only prints as a warning."""
    from ..knowledge.mined import knowledge

    found: list[Match] = []
    for line in lines:
        text = line.message.strip() or line.text.strip()
        if text:
            found += knowledge().match(text, engine)
    if not found:
        return None
    # the most specific template speaks (match() ranks them), an error before a warning;
    # a vaguer template with a class never outvotes it
    return min(found, key=lambda m: not m.template.is_error)


def message_phase(lines: list[Line], engine: str) -> tuple[str, str] | None:
    """The phase of the function that prints the OOM's own message (a router's "Request failed
    during generation", a worker's error from its serving loop)."""
    from ..knowledge.mined import knowledge

    k = knowledge()
    for line in lines:
        text = line.message.strip()
        for m in k.match(text, engine, errors_only=True) if text else ():
            t = m.template
            if not t.function:
                by_module = k.table.phase_of_module(t.module) if k.table is not None else None
                if by_module:
                    return by_module, f"{t.module}, a module of the {by_module} phase only"
                continue
            stem = t.module.rsplit("/", 1)[-1].removesuffix(".py")
            found = k.frame_phase([t.function.rsplit(".", 1)[-1], stem], engine)
            if found:
                return found[0], f"{t.module} {t.function} ({found[0]} call tree)"
    return None


def apply_template(f: Finding, m: Match) -> str:
    """A finding no rule names, classed by the engine's own message (medium confidence)."""
    t = m.template
    f.cls = m.cls
    f.rule = t.id
    f.confidence = "medium"
    f.consequence = False
    f.title = f"{_TEMPLATE_TITLE.get(m.cls, 'An error')} ({t.engine}: {t.exc or t.level} in {t.module})"
    for k, v in m.captures.items():
        f.facts.setdefault(f"said_{k}", v[:200])
    if t.param:
        f.facts["setting"] = t.param
    f.note = (
        f"known from {t.source}'s own source ({t.module}, {t.function or 'module level'}; versions "
        f"{t.versions}): no specific rule knows this message; its class comes from the table of "
        f"mined messages (row {t.row})"
    )
    return m.cls


_EXC_PREFIX = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*(?P<exc>[A-Z]\w*(?:Error|Exception))(?:\([^)]*\))?:\s*(?P<msg>.*)"
)


def exception_type(text: str) -> str:
    """The exception type a line raises ("TypeError" of "TypeError: unhashable type"), or ""."""
    m = _EXC_PREFIX.match(text.strip())
    return m.group("exc") if m else ""


def apply_class_table(f: Finding, raised: list[tuple[Line, str]], engine: str) -> str | None:
    """An exception no rule, template or word knows (a message newer than the mined versions):
    the class table read on its words, its type and the module that raised it (`raised`: the
    exception line, or an error line with its logger's location, and that module), low confidence."""
    from ..knowledge.mined import knowledge

    said: list[tuple[Line, str, str, str]] = []  # (line, message, exception type, module)
    for line, module in raised[:1]:
        m = _EXC_PREFIX.match(line.message.strip())
        msg, exc = (m.group("msg"), m.group("exc")) if m else (line.message.strip(), "")
        said.append((line, msg, exc, module))
    for where, msg, exc, module in said:
        t = knowledge().classify_line(msg, exc, module, engine)
        if t is None or t.cls is None:
            return None
        f.cls, f.confidence, f.consequence = t.cls, "low", False
        f.rule = f"mined.table.{t.row}"
        f.title = f"{_TEMPLATE_TITLE.get(t.cls, 'An error')} (by the words and module of {module})"
        f.line, f.evidence = where.number, where.message.strip()
        if t.param:
            f.facts["setting"] = t.param
        f.note = (
            "no rule, mined message or class word knows this exception; the table of mined messages "
            f"(row {t.row}) places it by its words and the module that raised it, so this reading is less certain"
        )
        if t.cls == "request" and f.severity == "fatal":
            f.severity = "error"
        return t.cls
    return None


_TEMPLATE_TITLE = {
    "oom": "Out of memory, in the engine's own words",
    "kv_cache_too_small": "The KV cache cannot hold what the launch asks",
    "gpu_busy": "GPU memory held by other processes",
    "tp_mismatch": "A parallel size the GPUs or the model cannot take",
    "nccl": "Collective communication failed",
    "port_in_use": "A port could not be bound",
    "weights_format": "The checkpoint cannot be loaded as it is",
    "driver": "The GPU platform or its driver refused",
    "config": "The engine refused a launch setting",
    "request": "A request was rejected",
}
