"""What a probe found: its checks, the cause of a failure with its changes, its timings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_PROMPT = "你好"


@dataclass
class Check:
    name: str
    ok: bool
    value: Any = None
    detail: str = ""


@dataclass
class Cause:
    cls: str  # the taxonomy class, or "service" for what the log would not show
    title: str
    advice: list[str]
    # the scan's own changes for the error message the server answered with (model.Change)
    changes: list[Any] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.cls,
            "title": self.title,
            "advice": self.advice,
            "changes": [c.to_json() for c in self.changes],
        }


@dataclass
class ProbeResult:
    url: str
    model: str | None = None
    checks: list[Check] = field(default_factory=list)
    text: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    tokens_per_s: float | None = None
    cause: Cause | None = None
    notes: list[str] = field(default_factory=list)
    max_model_len: int | None = None  # as GET /v1/models reports it (vLLM, SGLang)
    long_prompt: dict[str, Any] | None = None  # --long: tokens sent, accepted, TTFT

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def check(self, name: str, ok: bool, value: Any = None, detail: str = "") -> bool:
        self.checks.append(Check(name, ok, value, detail))
        return ok

    def fail(self, cls: str, title: str, *advice: str) -> None:
        if self.cause is None:
            self.cause = Cause(cls, title, list(advice))

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "url": self.url,
            "model": self.model,
            "checks": [asdict(c) for c in self.checks],
            "text": self.text,
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "ttft_ms": rounded(self.ttft_ms),
            "total_ms": rounded(self.total_ms),
            "tokens_per_s": rounded(self.tokens_per_s),
            "cause": self.cause.to_json() if self.cause else None,
            "notes": self.notes,
            "max_model_len": self.max_model_len,
            "long_prompt": self.long_prompt,
        }


def rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


@dataclass
class Timeouts:
    connect: float = 5.0
    first_byte: float = 120.0  # a cold first request may compile or capture graphs
    idle: float = 30.0  # the longest gap between streamed chunks a gateway would tolerate
