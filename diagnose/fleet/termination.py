"""The one-line verdict `run --termination-log` writes where Kubernetes shows it.

The kubelet reads a container's `terminationMessagePath` (default `/dev/termination-log`)
when it exits and puts the text in the pod's status (`lastState.terminated.message`, what
`kubectl describe pod` prints); it keeps at most 4096 bytes. One line: the status, the class
and OOM phase, where the startup stood, the evidence line, and the next change with its value.
"""

from __future__ import annotations

from ..base.redact import redact
from ..model.records import Diagnosis
from ..outputs.text import change_text

LIMIT = 4096  # bytes the kubelet keeps of a termination message
EVIDENCE_CHARS = 300


def message(d: Diagnosis, kind: str) -> str:
    """`kind`: the live verdict (fatal, ready, hang, stopped, ended, …)."""
    p = d.primary
    parts = [f"diagnose: {d.status}"]
    if kind not in ("fatal", "ended") and kind != d.status:
        parts[0] += f" ({kind})"
    if p is not None:
        what = p.cls + (f", {p.oom_phase} OOM" if p.oom_phase and p.cls.startswith("oom") else "")
        where = f" during {p.phase_at}" if p.phase_at else ""
        parts.append(f"{what}{where}: {p.title}")
        evidence = " ".join(p.evidence.split())
        if len(evidence) > EVIDENCE_CHARS:
            evidence = evidence[: EVIDENCE_CHARS - 1] + "…"
        parts.append(f"log line {p.line}: {evidence}")
    elif d.last_phase:
        parts.append(f"last phase {d.last_phase}")
    if d.advice:
        c = d.advice[0]
        parts.append(f"next: {change_text(c)}")  # fit() below makes its spacing one line's
    return fit(redact(" · ".join(parts)), LIMIT - 1)  # and its newline


def fit(text: str, limit: int = LIMIT) -> str:
    """One line of at most `limit` UTF-8 bytes, cut on a character boundary."""
    line = " ".join(text.split())
    raw = line.encode("utf-8")
    if len(raw) <= limit:
        return line
    return raw[: limit - len("…".encode())].decode("utf-8", "ignore") + "…"


def write(path: str, text: str) -> None:
    """Written whole (the kubelet reads it once the container has exited)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
