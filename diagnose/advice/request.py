"""One request or one launch setting the engine refused: a request too long for the context,
and a setting the engine's own message names."""

from __future__ import annotations

import re

from .core import Advisor, as_int, len_up

_FLAG_IN_MESSAGE = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:[-_][a-z0-9]+)+|[a-z]{3,})\b")


def request(a: Advisor) -> None:
    """A request too long: when the prompt alone exceeds the context, only a longer context
    helps (up to what the model allows); otherwise ask for fewer new tokens."""
    facts = a.finding.facts
    limit = as_int(facts.get("max_model_len") or facts.get("max_model_len2"))
    prompt = as_int(
        facts.get("input_tokens")
        or facts.get("input_tokens2")
        or facts.get("prompt_tokens")
        or facts.get("prompt_tokens2")
        or facts.get("requested_tokens")
    )
    if not (limit and prompt):
        if a.finding.severity == "fatal":
            # one request took the whole server down: the engine must reject it, not die of it
            a.add(
                "engine_version",
                "a release that rejects this request instead of crashing",
                "one request's input killed the server process; until then, validate such requests "
                "before they reach it",
            )
        return
    if prompt >= limit and a.has("max_model_len"):
        model_max = as_int(a.ctx.observed.get("model_max_len"))
        want = len_up(int(prompt * 1.25))
        cap = (
            f" (the model allows {model_max})"
            if model_max
            else " if the model's max_position_embeddings allows it"
        )
        to = min(want, model_max) if model_max else want
        if to > limit:
            a.add(
                "max_model_len",
                to,
                f"the prompt alone has {prompt} tokens, over the {limit}-token context: only a longer "
                f"context serves it, with room for the answer{cap}",
                limit,
            )
            a.complete = True  # fewer new tokens cannot help a prompt that alone is too long
            return
    if prompt < limit:
        a.add(
            "max_tokens",
            limit - prompt,
            f"the prompt has {prompt} tokens; {limit - prompt} new tokens fit the {limit}-token context",
        )
        a.complete = True


def config(a: Advisor) -> None:
    """The engine refused a launch setting: change the one its message names (a canonical
    parameter, or the flag itself in the engine's own name)."""
    f = a.finding
    if a.out:
        return
    setting, flag = f.facts.get("setting"), None
    if not setting:
        m = _FLAG_IN_MESSAGE.search(f.evidence)
        if m is None:
            return
        setting, flag = m.group(1).replace("-", "_"), "--" + m.group(1)
    a.add(
        str(setting),
        "the value the message asks for (or leave it unset)",
        f"the engine refused it: {f.evidence[:160]}",
        a.ctx.current(str(setting)),
        flag=flag,
    )
    if flag and a.out:
        a.out[-1].named_by_engine = True


VALUES: dict[str, object] = {}
CLASSES = {"request": request, "config": config}
