"""Secrets out of everything that leaves the process or is stored: one list, one function.

Logs carry tokens (a Hub token in a launch command, a password in a proxy URL, a cloud key in
an env dump). Every diagnosis is redacted when it is built (pipeline.diagnose), so text,
markdown and JSON output, `watch`/`run`, the incident store and its exports all see the same
masked text; `--show-secrets` keeps them for local use.

Home-grown rather than detect-secrets: we mask values in place inside a line that must stay
readable, on the scan path where an import costs more than the scan; the formats are the
well-known fixed-prefix token shapes (the same ones detect-secrets' plugins look for) plus
`key=value` secrets, and a corpus test covers each kind.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

MASK = "<redacted>"

# (kind, pattern). A pattern with groups keeps group 1 (and group 2) around the masked value.
_SOURCES: list[tuple[str, str]] = [
    ("private key", r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)"),
    ("huggingface token", r"\bhf_[A-Za-z0-9]{20,}\b"),
    ("anthropic key", r"\bsk-ant-[A-Za-z0-9_-]{16,}"),
    ("openai key", r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{16,}"),
    ("github token", r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})"),
    ("gitlab token", r"\bglpat-[A-Za-z0-9_-]{20,}"),
    ("slack token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    ("aws access key id", r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b"),
    ("gcp api key", r"\bAIza[0-9A-Za-z_-]{35}\b"),
    ("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    ("azure key", r"((?:AccountKey|SharedAccessKey|sig)=)[A-Za-z0-9+/%=]{16,}"),
    ("bearer token", r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    ("basic auth", r"(?i)(\bauthorization:\s*basic\s+)[A-Za-z0-9+/=]{8,}"),
    # any user:password@ in a URL, the user empty too (redis://:pass@host)
    ("password in url", r"([a-z][a-z0-9+.-]*://[^\s:/@'\"]*:)[^\s@/'\"]+(@)"),
    ("slack webhook", r"(https://hooks\.slack\.com/(?:services|workflows|triggers)/)[A-Za-z0-9/_-]{8,}"),
    ("sendgrid key", r"\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"),
    ("google oauth secret", r"\bGOCSPX-[A-Za-z0-9_-]{20,}"),
    ("docker auth", r"(\\?\"auths?\\?\"\s*:\s*\\?\")[A-Za-z0-9+/=]{8,}"),
    (
        "secret setting",
        # password=…, "api_key": "…", AWS_SECRET_ACCESS_KEY=…, HF_TOKEN: …, hf_token='…'
        r"(?i)((?:\b|_)(?:api[_-]?key|apikey|access[_-]?key(?:[_-]?id)?|secret(?:[_-]?access)?[_-]?key|"
        r"client[_-]?secret|secret|token|auth[_-]?token|password|passwd|private[_-]?key|credentials?)"
        r"\\?['\"]?\s*[=:]\s*\\?['\"]?)(?!<redacted)(?!None\b|null\b|False\b|True\b|\*+)"
        # a count after "token" is not one: SGLang's "#token: 441000", "#full token: 2435072"
        r"(?:(?<!token: )(?<!token:)(?<!token=)|(?!\d+(?![^\s'\",)}\]])))[^\s'\",)}\]\\]{4,}",
    ),
    ("secret flag", r"(?i)(--(?:api-key|hf-token|token|password|secret|auth-token)[= ])(?!<redacted)\S+"),
]
# Per kind, words (lower case) one of which its secret's line must hold: a pattern is
# compiled and run only on text that has one (a plain scan then compiles one or two, not 16).
_WORDS: dict[str, tuple[str, ...]] = {
    "private key": ("private key",),
    "huggingface token": ("hf_",),
    "anthropic key": ("sk-ant-",),
    "openai key": ("sk-",),
    "github token": ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    "gitlab token": ("glpat-",),
    "slack token": ("xox",),
    "aws access key id": ("akia", "asia", "agpa", "aida", "aroa", "anpa", "anva", "aipa"),
    "gcp api key": ("aiza",),
    "jwt": ("eyj",),
    "azure key": ("accountkey=", "sharedaccesskey=", "sig="),
    "bearer token": ("bearer",),
    "basic auth": ("basic",),
    "password in url": ("://",),
    "slack webhook": ("hooks.slack.com",),
    "sendgrid key": ("sg.",),
    "google oauth secret": ("gocspx-",),
    "docker auth": ('"auth',),
    "secret setting": ("key", "secret", "token", "passw", "credential"),
    "secret flag": ("--",),
}
_COMPILED: dict[str, re.Pattern[str]] = {}
# A cheap first test: text without any of these cannot hold a secret of the kinds above.
_HINT = re.compile(
    r"(?i)hf_|sk-|gh[pousr]_|github_pat|glpat|xox|AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA|AIza|eyJ|key|"
    r"bearer|basic|://[^\s@]*@|secret|token|passw|pwd|credential|PRIVATE KEY|hooks\.slack|SG\.|GOCSPX|\"auth"
)
# launch/config keys whose values are secrets whatever they look like
SECRET_KEYS = re.compile(
    r"(?i)(?:^|[_-])(?:token|secret|secret[_-]?key|password|passwd|api[_-]?key|apikey|credentials?|private[_-]?key)$"
)


def _pattern(kind: str, src: str) -> re.Pattern[str]:
    pat = _COMPILED.get(kind)
    if pat is None:
        pat = _COMPILED[kind] = re.compile(src)
    return pat


def redact(text: str, found: dict[str, int] | None = None) -> str:
    """The text with every secret value masked; `found` counts the kinds masked."""
    if not text or not _HINT.search(text):
        return text
    low = text.lower()
    for kind, src in _SOURCES:
        if not any(w in low for w in _WORDS[kind]):
            continue
        pat = _pattern(kind, src)

        def sub(m: re.Match[str], kind: str = kind) -> str:
            if found is not None:
                found[kind] = found.get(kind, 0) + 1
            groups = [g for g in m.groups() if g is not None]
            if len(m.groups()) == 2 and len(groups) == 2:
                return f"{groups[0]}{MASK}{groups[1]}"
            if m.groups() and m.group(1) is not None:
                return f"{m.group(1)}{MASK}"
            return MASK

        text = pat.sub(sub, text)
    return text


def redact_tree(value: Any, found: dict[str, int] | None = None, key: str = "") -> Any:
    """Strings inside dicts and lists redacted; a value under a secret-named key masked whole."""
    if isinstance(value, str):
        if key and SECRET_KEYS.search(key) and value and value.lower() not in ("none", "null", "false"):
            if found is not None:
                found["secret setting"] = found.get("secret setting", 0) + 1
            return MASK
        return redact(value, found)
    if isinstance(value, list):
        return [redact_tree(v, found, key) for v in value]
    if isinstance(value, tuple):
        return tuple(redact_tree(v, found, key) for v in value)
    if isinstance(value, dict):
        return {k: redact_tree(v, found, str(k)) for k, v in value.items()}
    return value


def redact_diagnosis(d: Any) -> Any:
    """Every string a diagnosis carries out of the process, masked (in place; returned)."""
    for f in d.findings:
        f.evidence = redact(f.evidence)
        f.title = redact(f.title)
        if f.note:
            f.note = redact(f.note)
        f.facts = redact_tree(f.facts)
    for m in d.timeline:
        m.text = redact(m.text)
    d.launch = redact_tree(d.launch)
    for c in d.advice:
        c.why = redact(c.why)
        c.frm = redact(c.frm) if c.frm else c.frm
        c.to = redact(c.to)
    if d.engine.reason:
        d.engine.reason = redact(d.engine.reason)
    if d.serving is not None:
        for p in d.serving.points:
            p.text = redact(p.text)
        d.serving.why = redact(d.serving.why)
    return d
