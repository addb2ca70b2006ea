"""An error the server answers with, read by the scan's rules and advice (a 400 that names the
context length gets the same change a log line would), and errors of the connection itself.
"""

from __future__ import annotations

from typing import Any

from .result import ProbeResult


def scan_changes(message: str) -> list[Any]:
    """The changes the scan's rules and advice give for an error message a server answered
    with: one knowledge, and one change type, for `scan`, `check` and `probe`."""
    from ..knowledge.loaded import Knowledge
    from ..match.scanner import Scanner
    from ..pipeline.stages import diagnose

    know = Knowledge.load()
    scanner = Scanner(know.rules, know.profiles)
    scanner.feed(("ERROR " + " ".join(message.split()) + "\n").encode("utf-8", "replace"))
    d = diagnose(scanner.finish(), know, "the server's answer")
    return list(d.advice) if d.primary is not None else []


def error_cause(res: ProbeResult, status: int, body: Any, text: str) -> None:
    """Map an HTTP error (OpenAI-style body or not) to its usual cause, with the scan's changes
    for the message it carries (not for a refused key: nothing to change on the server)."""
    _http_cause(res, status, body, text)
    message, _ = _error_of(body, text)
    if res.cause is not None and message.strip() and status not in (401, 403):
        res.cause.changes = scan_changes(message[:2000])


def _error_of(body: Any, text: str) -> tuple[str, str]:
    """(message, type) of an error body: OpenAI's {"error": {...}}, vLLM's ErrorResponse, or text."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, str):
        err = {"message": err}
    if err is None and isinstance(body, dict) and body.get("object") == "error":
        err = body  # vLLM's ErrorResponse
    from ..base.redact import redact  # a server may echo the key it refused

    message = redact(str((err or {}).get("message") or text or "")[:300])
    return message, str((err or {}).get("type") or (err or {}).get("code") or "")


def _http_cause(res: ProbeResult, status: int, body: Any, text: str) -> None:
    """The usual cause of an HTTP error, by its status and message."""
    message, etype = _error_of(body, text)
    low = message.lower()
    if status in (401, 403):
        res.fail(
            "request",
            f"the server wants credentials (HTTP {status}): {message or 'no body'}",
            "pass the server's key: diagnose probe --api-key KEY (or set OPENAI_API_KEY); "
            "vLLM/SGLang take theirs with --api-key, TGI behind a gateway may want --header",
        )
    elif (
        "does not exist" in low
        or ("not found" in low and "model" in low)
        or etype in ("NotFoundError", "model_not_found")
    ):
        res.fail(
            "request",
            f"the server does not know the model {res.model!r}: {message}",
            "use the name from GET /v1/models, or start the server with --served-model-name set to it",
        )
    elif "context length" in low or "maximum context" in low or "too long" in low:
        res.fail(
            "request",
            f"the request does not fit the context: {message}",
            "lower max_tokens or the prompt, or raise --max-model-len (see diagnose scan)",
        )
    elif status >= 500:
        res.fail(
            "service",
            f"the server failed the request (HTTP {status}): {message or 'no body'}",
            "look at the server log: diagnose scan serve.log",
        )
    else:
        res.fail(
            "request",
            f"the server refused the request (HTTP {status}{', ' + etype if etype else ''}): "
            f"{message or 'no body'}",
            "check the request parameters against the server's API (e.g. --chat for chat-only models)",
        )


def name_not_resolved(e: Exception) -> bool:
    """A DNS failure, not a closed port (httpx wraps socket.gaierror in ConnectError)."""
    import socket

    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, socket.gaierror):
            return True
        seen = seen.__cause__ or seen.__context__
    text = str(e).lower()
    return "name or service not known" in text or "nodename nor servname" in text or "name resolution" in text
