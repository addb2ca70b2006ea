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
    ("npm token", r"\bnpm_[A-Za-z0-9]{36}\b"),
    # a known prefix whose token a wrapped line (or a paste) cut short: still random-looking
    # (both cases), so `hf_transfer` and `sk-learn` stay
    (
        "token cut short",
        r"\b(?:hf_|gh[pousr]_|glpat-|npm_|sk-(?:proj-|ant-)?)(?=[A-Za-z0-9]*[A-Z])(?=[A-Za-z0-9]*[a-z])[A-Za-z0-9]{8,}",
    ),
    ("stripe key", r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    ("pypi token", r"\bpypi-[A-Za-z0-9_-]{40,}"),
    ("databricks token", r"\bdapi[0-9a-f]{32}\b"),
    ("docker auth", r"(\\?\"auths?\\?\"\s*:\s*\\?\")[A-Za-z0-9+/=]{8,}"),
    (
        "secret setting",
        # password=…, "api_key": "…", AWS_SECRET_ACCESS_KEY=…, HF_TOKEN: …, hf_token='…'
        r"(?i)((?:\b|_)(?:api[_-]?key|apikey|access[_-]?key(?:[_-]?id)?|secret(?:[_-]?access)?[_-]?key|"
        r"client[_-]?secret|secret|token|auth[_-]?token|password|passwd|private[_-]?key|credentials?)"
        r"\\?['\"]?\s*[=:]\s*\\?['\"]?)(?!<redacted)(?!None\b|null\b|False\b|True\b|\*+)"
        # a count after "token" is not one: SGLang's "#token: 441000", "#full token: 2435072",
        # a plan's "kv_bytes_per_token": 57344
        r"(?:(?<!token: )(?<!token:)(?<!token=)(?<!token\": )(?<!token\":)(?<!token': )"
        r"|(?!\d+(?:\.\d+)?(?![^\s'\",)}\]])))[^\s'\",)}\]\\]{4,}",
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
    "npm token": ("npm_",),
    "token cut short": ("hf_", "gh", "glpat-", "npm_", "sk-"),
    "stripe key": ("_live_", "_test_"),
    "pypi token": ("pypi-",),
    "databricks token": ("dapi",),
    "docker auth": ('"auth',),
    "secret setting": ("key", "secret", "token", "passw", "credential"),
    "secret flag": ("--",),
}
_COMPILED: dict[str, re.Pattern[str]] = {}
# A cheap first test: text without any of these words (lower case) cannot hold a secret of the
# kinds above; one automaton pass finds them all (a case-insensitive alternation of them on
# `re` read 2 MB/s).
# the words after which a random-looking value is taken for a secret (_NEAR_WORD below)
_NEAR_WORDS = ("key", "token", "secret", "passw", "pwd", "credential", "auth")
_HINT_WORDS = sorted({w for ws in _WORDS.values() for w in ws} | set(_NEAR_WORDS))
_HINTER: list[Any] = []  # the automaton over _HINT_WORDS, built on first use (None: not installed)


def _hinter() -> Any:
    if not _HINTER:
        try:
            import ahocorasick_rs

            _HINTER.append(ahocorasick_rs.AhoCorasick(_HINT_WORDS))
        except ImportError:
            _HINTER.append(None)
    return _HINTER[0]


def _words_in(low: str) -> set[str]:
    """The hint words a lowered text holds."""
    ac = _hinter()
    if ac is None:
        return {w for w in _HINT_WORDS if w in low}
    return {_HINT_WORDS[m[0]] for m in ac.find_matches_as_indexes(low, overlapping=True)}


def _hint_positions(low: str) -> list[int]:
    """Where the hint words start in a lowered text, in order (character offsets)."""
    ac = _hinter()
    if ac is None:
        return sorted(i for w in _HINT_WORDS for i in _all_at(low, w))
    return sorted(m[1] for m in ac.find_matches_as_indexes(low))


def _all_at(text: str, word: str) -> list[int]:
    out, i = [], text.find(word)
    while i >= 0:
        out.append(i)
        i = text.find(word, i + 1)
    return out


# A value no format above knows: a long, random-looking run of token characters within a few
# characters after a word that says secret (the general rule behind detect-secrets'
# high-entropy plugins, held to the words so hashes and request ids elsewhere stay readable)
_NEAR_WORD = re.compile(
    r"(?i)(?:key|token|secret|passw\w*|pwd|credential\w*|auth\w*)\b[^\n]{0,40}?(?<![A-Za-z0-9+/_=.-])"
    r"([A-Za-z0-9+/_=.-]{20,})"
)
ENTROPY_BITS = 3.5  # bits a character: random base64/hex-mixed tokens are above, words below
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
    if not text:
        return text
    present = _words_in(text.lower())
    if not present:
        return text
    for kind, src in _SOURCES:
        if present.isdisjoint(_WORDS[kind]):
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
    return _mask_random_near_words(text, found, present)


def _entropy(s: str) -> float:
    import math

    counts: dict[str, int] = {}
    for ch in s:
        counts[ch] = counts.get(ch, 0) + 1
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _random_looking(s: str) -> bool:
    """Letters and digits mixed, ENTROPY_BITS a character, no `=` but base64's padding: not a
    word, an identifier, a `key=value` pair, a path or a model name."""
    if MASK in s or s.count("/") > 2 or "=" in s.rstrip("="):
        return False
    has_digit = any(c.isdigit() for c in s)
    has_letter = any(c.isalpha() for c in s)
    return has_digit and has_letter and _entropy(s) >= ENTROPY_BITS


def _mask_random_near_words(text: str, found: dict[str, int] | None, present: set[str]) -> str:
    if present.isdisjoint(_NEAR_WORDS):
        return text

    def sub(m: re.Match[str]) -> str:
        value = m.group(1)
        if not _random_looking(value):
            return m.group(0)
        if found is not None:
            found["random value near a secret word"] = found.get("random value near a secret word", 0) + 1
        return m.group(0)[: m.start(1) - m.start(0)] + MASK

    return _NEAR_WORD.sub(sub, text)


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


# --- the last gate: everything the process prints -------------------------------------------

SHOWN = [False]  # `--show-secrets`: the user asked to see them (local use)


def show_secrets() -> None:
    SHOWN[0] = True


def _redact_lines(chunk: str) -> str:
    """Whole lines redacted; only those holding a hint word are looked at (one automaton pass
    over the chunk finds them, not a Python call a line: 41,000 lines of JSON for 133 logs)."""
    at = _hint_positions(chunk.lower())
    if not at:
        return chunk
    out: list[str] = []
    done = 0
    for pos in at:
        if pos < done:
            continue  # a line already redacted
        start = chunk.rfind("\n", 0, pos) + 1
        nl = chunk.find("\n", pos)
        end = len(chunk) if nl < 0 else nl
        out.append(chunk[done:start])
        out.append(redact(chunk[start:end]))
        done = end
    out.append(chunk[done:])
    return "".join(out)


class RedactingWriter:
    """stdout or stderr with every line redacted on its way out: whatever a command, renderer
    or error message prints passes here, so none can bypass the masking (the diagnosis is
    redacted when it is built; this is the gate behind it). Whole lines are masked (a secret
    is never cut between two writes); a partial line goes out on flush. Bytes written to
    `.buffer` (the server's own output that `run` tees) are not ours to change."""

    def __init__(self, stream: Any):
        self._stream = stream
        self._partial = ""
        self._encoding = _narrow_encoding(stream)  # a console that cannot print ✓ → ASCII

    def _out(self, text: str) -> None:
        if self._encoding is not None:
            text = as_ascii(text, self._encoding)
        self._stream.write(text)

    def write(self, text: str) -> int:
        if SHOWN[0]:
            self._out(text)
            return len(text)
        data = self._partial + text
        cut = data.rfind("\n")
        if cut < 0:
            self._partial = data
            return len(text)
        self._partial = data[cut + 1 :]
        self._out(_redact_lines(data[: cut + 1]))
        return len(text)

    def flush(self) -> None:
        if self._partial:
            part, self._partial = self._partial, ""
            self._out(part if SHOWN[0] else redact(part))
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


# what the output's symbols read as where the console is ASCII (PYTHONIOENCODING=ascii, a
# C locale, some Windows consoles): the meaning kept, never an encoding error
_ASCII = str.maketrans(
    {
        "✓": "OK", "✗": "X", "→": "->", "←": "<-", "…": "...", "·": "-", "×": "x", "—": "-",
        "–": "-", "≤": "<=", "≥": ">=", "≈": "~", "│": "|", "─": "-", "█": "#", "⚠": "!",
        "≠": "!=", "’": "'", "‘": "'", "“": '"', "”": '"', "•": "*", "±": "+/-", "▁": "_",
    }
)  # fmt: skip


def _narrow_encoding(stream: Any) -> str | None:
    """The stream's encoding when it cannot carry the output's symbols (None: it can)."""
    enc = getattr(stream, "encoding", None) or "utf-8"
    try:
        "✓✗→…·".encode(enc)
        return None
    except (UnicodeEncodeError, LookupError):
        return enc


def as_ascii(text: str, encoding: str = "ascii") -> str:
    """The text in what `encoding` can print: the symbols spelled out, anything else a `?`."""
    try:
        return text.translate(_ASCII).encode(encoding, "replace").decode(encoding)
    except LookupError:
        return text.translate(_ASCII).encode("ascii", "replace").decode("ascii")
