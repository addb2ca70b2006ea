"""`diagnose probe`: the minimal request that proves an OpenAI-compatible server really serves.

"The process is up" is not "the service works" (seed 000): one short completion, checked for
shape (status, JSON, text, finish reason, usage) and timed (first token, total, tokens/s),
streaming and not, with the failure mapped to its usual cause and the next step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import httpx

from .result import DEFAULT_PROMPT, DEFAULT_URL, ProbeResult, Timeouts, rounded
from .server_errors import error_cause, name_not_resolved


def _json_or_none(r: Any) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


def _payload(model: str | None, prompt: str, max_tokens: int, chat: bool, stream: bool) -> dict[str, Any]:
    p: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0}
    if model:
        p["model"] = model
    if chat:
        p["messages"] = [{"role": "user", "content": prompt}]
    else:
        p["prompt"] = prompt
    if stream:
        p["stream"] = True
        p["stream_options"] = {"include_usage": True}
    return p


def _choice_text(choice: dict[str, Any], chat: bool) -> str | None:
    if chat:
        msg = choice.get("message") or choice.get("delta") or {}
        content = msg.get("content") if isinstance(msg, dict) else None
        return content if isinstance(content, str) else None
    t = choice.get("text")
    return t if isinstance(t, str) else None


def probe(
    url: str = DEFAULT_URL,
    model: str | None = None,
    prompt: str = DEFAULT_PROMPT,
    max_tokens: int = 16,
    chat: bool = False,
    timeouts: Timeouts | None = None,
    retry_cold: bool = True,
    api_key: str | None = None,
    headers: dict[str, str] | None = None,
) -> ProbeResult:
    t = timeouts or Timeouts()
    url = url.rstrip("/")
    res = ProbeResult(url=url, model=model)
    timeout = httpx.Timeout(connect=t.connect, read=t.first_byte, write=t.connect, pool=t.connect)
    sent = dict(headers or {})
    if api_key:
        sent["Authorization"] = f"Bearer {api_key}"
    with httpx.Client(timeout=timeout, trust_env=False, headers=sent) as client:
        if not _find_model(client, res):
            return res
        for attempt in (1, 2):
            cold = _plain_request(client, res, prompt, max_tokens, chat)
            if cold and retry_cold and attempt == 1:
                res.notes.append(
                    "no first byte in time: a cold first request (graph capture, compilation) is normal "
                    "once; retried once"
                )
                res.checks.clear()
                res.cause = None
                continue
            break
        if res.ok:
            _stream_request(client, res, prompt, max_tokens, chat, t)
    return res


def _find_model(client: httpx.Client, res: ProbeResult) -> bool:
    try:
        r = client.get(res.url + "/v1/models")
    except httpx.ConnectError as e:
        res.check("connect", False, None, str(e))
        if name_not_resolved(e):
            res.fail(
                "service",
                f"the host name in {res.url} does not resolve: {e}",
                "check the spelling, or use the IP address; inside Docker/Kubernetes use the service name",
            )
            return False
        res.fail(
            "service",
            f"nothing is listening at {res.url}",
            "is the server up? follow its startup with: diagnose watch serve.log",
            "check host/port: vLLM listens on 8000, SGLang on 30000, TGI on 3000 by default",
        )
        return False
    except httpx.TimeoutException:
        res.check("connect", False, None, "no answer to GET /v1/models")
        res.fail(
            "hang",
            "the server accepted the connection but did not answer GET /v1/models",
            "it may still be starting or be stuck: diagnose watch serve.log",
        )
        return False
    res.check("connect", True, res.url)
    if r.status_code in (401, 403):
        res.check("auth", False, r.status_code, "GET /v1/models was refused")
        error_cause(res, r.status_code, _json_or_none(r), r.text)
        return False
    try:
        entries = [m for m in r.json().get("data", []) if isinstance(m, dict)]
    except (ValueError, AttributeError):
        entries = []
    models = [m.get("id") for m in entries]
    chosen = next((m for m in entries if m.get("id") == res.model), entries[0] if entries else {})
    if isinstance(chosen.get("max_model_len"), int):
        res.max_model_len = chosen["max_model_len"]
    if res.model:
        return True
    if r.status_code == 200 and models:
        res.model = models[0]
        if len(models) > 1:
            res.notes.append(f"the server serves {len(models)} models; probing {res.model} (use --model)")
    else:
        res.notes.append(
            f"GET /v1/models gave HTTP {r.status_code} with no model list; sending no model name"
        )
    return True


def _plain_request(client: httpx.Client, res: ProbeResult, prompt: str, max_tokens: int, chat: bool) -> bool:
    """The non-streaming request and its shape checks. True when it timed out before any byte."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    try:
        r = client.post(res.url + path, json=_payload(res.model, prompt, max_tokens, chat, stream=False))
    except httpx.TimeoutException:
        res.check("first byte", False, None, "no response before the first-byte timeout")
        res.fail(
            "hang",
            "the server took the request but sent nothing back",
            "it is stuck or still warming up (first-request compilation): wait, then retry",
            "diagnose watch serve.log shows whether it is still starting",
        )
        return True
    except httpx.HTTPError as e:
        res.check("http", False, None, f"{type(e).__name__}: {e}")
        res.fail(
            "service",
            "the connection broke during the request",
            "look at the server log: diagnose scan serve.log",
        )
        return False
    try:
        body = r.json()
        is_json = isinstance(body, dict)
    except ValueError:
        body, is_json = None, False
    if not res.check("status", r.status_code == 200, r.status_code):
        error_cause(res, r.status_code, body, r.text)
        return False
    if not res.check(
        "json",
        is_json,
        None if is_json else r.text[:80],
        "" if is_json else "the body is not JSON (an error page, a proxy, or empty)",
    ):
        res.fail(
            "service",
            "the server answered 200 but not with JSON",
            "a proxy or gateway may be answering instead of the server (check NO_PROXY and the URL)",
        )
        return False
    _check_answer(res, body, chat, max_tokens)
    return False


def _check_answer(res: ProbeResult, body: dict[str, Any], chat: bool, max_tokens: int) -> None:
    """The answer's shape: text, finish reason, usage that adds up, output that is not degenerate."""
    choices = body.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    res.text = _choice_text(choice, chat)
    has_text = bool(res.text and res.text.strip())
    res.check("text", has_text, (res.text or "")[:60], "" if has_text else "no generated text")
    res.finish_reason = choice.get("finish_reason")
    finished = res.finish_reason in ("length", "stop")
    res.check("finish_reason", finished, res.finish_reason, "" if finished else "expected 'length' or 'stop'")
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
    res.usage = usage
    adds_up = (
        bool(usage)
        and all(isinstance(usage.get(k), int) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
        and usage["prompt_tokens"] + usage["completion_tokens"] == usage["total_tokens"]
    )
    res.check("usage", adds_up, usage, "" if adds_up else "prompt + completion tokens must equal total")
    if res.ok and res.text:
        completion = usage.get("completion_tokens") if usage else None
        odd = degenerate(res.text, res.finish_reason, completion, max_tokens)
        res.check("output", odd is None, None, odd or "no repetition loop, not cut short")
        if odd is not None:
            res.fail(
                "service",
                f"the output looks degenerate: {odd}",
                "a silent engine/kernel mismatch shows first as repetition or cut text: the attention backend, "
                "a quantization kernel, the dtype, or an engine upgrade (compare with the previous version)",
                "check the chat template and generation_config (repetition_penalty, stop tokens)",
            )
            return
    if not res.ok:
        res.fail(
            "service",
            "the answer's shape is wrong: " + ", ".join(c.name for c in res.checks if not c.ok),
            "an empty or malformed answer after a clean start often means a wrong chat template or tokenizer "
            "(try --chat, or check the model's generation_config)",
        )


def sse_events(r: Any) -> Iterator[tuple[float, dict[str, Any] | None]]:
    """(arrival time, event) for each `data:` event of a server-sent stream; the event is None
    for `[DONE]`, the last one. Lines that are not JSON are skipped, as clients do."""
    for line in r.iter_lines():
        now = time.monotonic()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            yield now, None
            return
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield now, event


@dataclass
class Streamed:
    """What a completion stream delivered: each text piece with its arrival time, the usage the
    server reported, and whether [DONE] came. Filled as it arrives, so a stream cut by an error
    still says how far it got."""

    pieces: list[tuple[float, str]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    done: bool = False


def read_stream(r: Any, chat: bool, into: Streamed) -> None:
    """Read an open completion stream (the probe's and the sweep's) into `into`."""
    for now, event in sse_events(r):
        if event is None:
            into.done = True
            return
        if isinstance(event.get("usage"), dict):
            into.usage = event["usage"]
        for ch in event.get("choices") or []:
            text = _choice_text(ch, chat)
            if text:
                into.pieces.append((now, text))


def _longest_run(units: list[str], n: int, off: int) -> int:
    """The most times one n-unit phrase follows itself, reading from `off` in steps of n."""
    run = best = 1
    for i in range(off + n, len(units) - n + 1, n):
        run = run + 1 if units[i : i + n] == units[i - n : i] else 1
        best = max(best, run)
    return best


def degenerate(text: str, finish_reason: str | None, completion: int | None, max_tokens: int) -> str | None:
    """Why an answer looks broken, or None: one phrase repeated over most of it (a loop may
    start after a sane beginning), or a stop for `length` far below the max_tokens asked for
    (a limit of the engine's own cut it)."""
    words = text.split()
    units = words if len(words) >= 8 else [c for c in text if not c.isspace()]  # CJK: characters
    if len(units) >= 12:
        for n in range(1, 9):
            best = max(_longest_run(units, n, off) for off in range(n))
            if best >= 4 and best * n >= 0.6 * len(units):
                what = f"phrase of {n} {'words' if units is words else 'characters'}" if n > 1 else "token"
                return f"the same {what} repeated {best} times"
    if finish_reason == "length" and completion is not None and completion < max_tokens / 2:
        return f"finish_reason 'length' after {completion} of {max_tokens} tokens: a limit below max_tokens cut it"
    return None


LONG_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "and"]


def long_request(
    url: str,
    res: ProbeResult,
    tokens: int | None,
    chat: bool,
    t: Timeouts,
    headers: dict[str, str] | None = None,
) -> None:
    """One prompt of about `tokens` tokens (default: close to max_model_len): accepted, and TTFT."""
    want = tokens or (res.max_model_len - 64 if res.max_model_len and res.max_model_len > 128 else None)
    if want is None:
        res.check("long prompt", False, None, "the server does not report max_model_len: give --long N")
        res.fail("service", "no length to try", "give the prompt length: --long 30000")
        return
    # common words of one token each in the usual BPE vocabularies; the usage line says the truth
    prompt = " ".join(LONG_WORDS[i % len(LONG_WORDS)] for i in range(want))
    path = "/v1/chat/completions" if chat else "/v1/completions"
    timeout = httpx.Timeout(connect=t.connect, read=t.first_byte, write=max(t.connect, 60.0), pool=t.connect)
    start = time.monotonic()
    first: float | None = None
    sent_tokens: int | None = None
    try:
        with (
            httpx.Client(timeout=timeout, trust_env=False, headers=headers or {}) as client,
            client.stream("POST", url + path, json=_payload(res.model, prompt, 4, chat, True)) as r,
        ):
            if r.status_code != 200:
                text = r.read().decode("utf-8", "replace")
                res.long_prompt = {
                    "tokens": want,
                    "accepted": False,
                    "status": r.status_code,
                    "ttft_ms": None,
                }
                res.check("long prompt", False, r.status_code, f"about {want} tokens refused: {text[:160]}")
                error_cause(res, r.status_code, None, text)
                if res.cause is not None and res.max_model_len:
                    res.cause.advice.append(
                        f"the server reports max_model_len {res.max_model_len}: a context that fits at start "
                        "must also fit a real prompt plus max_tokens"
                    )
                return
            for now, event in sse_events(r):
                if event is None:
                    break
                if isinstance(event.get("usage"), dict):
                    sent_tokens = event["usage"].get("prompt_tokens")
                if first is None and any(_choice_text(ch, chat) for ch in event.get("choices") or []):
                    first = now
    except httpx.TimeoutException:
        res.long_prompt = {"tokens": want, "accepted": False, "status": None, "ttft_ms": None}
        res.check("long prompt", False, None, f"no token within {t.first_byte:.0f} s for about {want} tokens")
        res.fail(
            "hang",
            "a long prompt gets no answer in time",
            "its prefill may exceed the server's memory or time: lower max_num_batched_tokens "
            "(chunked prefill) or max_model_len",
        )
        return
    except httpx.HTTPError as e:
        res.long_prompt = {"tokens": want, "accepted": False, "status": None, "ttft_ms": None}
        res.check("long prompt", False, None, f"{type(e).__name__}: {e}")
        res.fail(
            "service",
            "the connection broke on a long prompt",
            "diagnose scan the server log: an OOM in prefill?",
        )
        return
    ttft = None if first is None else round(1000 * (first - start), 1)
    res.long_prompt = {"tokens": sent_tokens or want, "accepted": True, "status": 200, "ttft_ms": ttft}
    res.check(
        "long prompt",
        first is not None,
        ttft,
        f"about {sent_tokens or want} tokens accepted; ms to the first token",
    )


def _stream_request(
    client: httpx.Client, res: ProbeResult, prompt: str, max_tokens: int, chat: bool, t: Timeouts
) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    start = time.monotonic()
    got = Streamed()
    try:
        with client.stream(
            "POST", res.url + path, json=_payload(res.model, prompt, max_tokens, chat, True)
        ) as r:
            if r.status_code != 200:
                res.check("stream status", False, r.status_code)
                error_cause(res, r.status_code, None, r.read().decode("utf-8", "replace"))
                return
            read_stream(r, chat, got)
    except httpx.TimeoutException:
        res.check("stream", False, len(got.pieces), "the stream stalled past the timeout")
    except httpx.HTTPError as e:
        res.check("stream", False, len(got.pieces), f"{type(e).__name__}: {e}")
    end = time.monotonic()
    chunks, done, usage = len(got.pieces), got.done, got.usage
    first = got.pieces[0][0] if got.pieces else None
    longest_gap = max((b[0] - a[0] for a, b in pairwise(got.pieces)), default=0.0)
    if not done and not any(c.name == "stream" for c in res.checks):
        res.check("stream", False, chunks, "the stream ended before [DONE]")
    if not done:
        res.fail(
            "service",
            f"the stream was cut after {chunks} chunks",
            "truncation checklist: max_tokens within max_model_len; gateway/proxy read timeouts above the "
            "longest pause; the server log at that moment (diagnose scan)",
        )
        return
    res.check("stream", True, chunks)
    if first is None:
        res.check("ttft", False, None, "no token was streamed")
        res.fail("service", "the stream finished without any token", "check the chat template / --chat")
        return
    res.ttft_ms = 1000 * (first - start)
    res.total_ms = 1000 * (end - start)
    tokens = (usage or {}).get("completion_tokens") or chunks
    decode_s = end - first
    res.tokens_per_s = tokens / decode_s if decode_s > 0 and tokens > 1 else None
    res.check("ttft", True, rounded(res.ttft_ms), "ms to the first streamed token")
    res.check("total", True, rounded(res.total_ms), "ms")
    res.check(
        "idle gap",
        longest_gap <= t.idle,
        round(longest_gap, 2),
        ""
        if longest_gap <= t.idle
        else f"a {longest_gap:.1f} s pause: gateways with a {t.idle:.0f} s read "
        "timeout would cut this stream",
    )
