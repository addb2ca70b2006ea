"""Every error message of the engine catalogues in ../shared/reference, as a log line.

The catalogues (`engine-messages.md`: vLLM, SGLang, TGI and the shared libraries;
`engine-messages-more.md`: Ollama, llama-server, LMDeploy, TensorRT-LLM) list each message
with where it comes from, what it means and which knob it points at. This module reads their
error tables, fills the placeholders with plausible values, writes each message in its
engine's own line format, and assigns the class its meaning implies (from the section it is
in and the catalogue's own "Meaning" text). Messages the catalogue calls warnings, info,
benign or recoverable are expected to raise no failure at all.

It measures coverage beyond the real logs: how many messages, written as they would appear,
the tool classes as their meaning says. Used by tests/test_catalogue.py; run it directly
(`python -m tests.catalogue`) to list the misses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REFERENCE = Path(__file__).resolve().parent.parent.parent / "shared" / "reference"
CATALOGUES = ("engine-messages.md", "engine-messages-more.md")

MEMORY = frozenset({"oom", "kv_cache_too_small", "gpu_busy", "preemption"})
PARALLEL = frozenset({"tp_mismatch", "nccl", "driver"})
PORT = frozenset({"port_in_use"})
WEIGHTS = frozenset({"weights_format"})
DRIVER = frozenset({"driver", "weights_format"})  # an engine build that does not match is either
REQUEST = frozenset({"request"})
LIVENESS = frozenset({"hang", "nccl", "unknown_error"})  # wrappers say "look above": unknown is right
# a launch setting the engine refuses: `config` since the class exists (DESIGN's taxonomy); the
# classes the tool gave such lines before it are still accepted
CONFIG = frozenset({"config", "request", "unknown_error", "weights_format", "kv_cache_too_small"})
BENIGN = frozenset()  # expected: no failure

# Sections that hold error tables, by their heading's start.
_TABLE_SECTIONS = {
    "engine-messages.md": re.compile(r"^(?:1\.4\.\d |2\.3 Error catalogue|3\.2 Error catalogue|4\.[123] )"),
    "engine-messages-more.md": re.compile(r"^(?:1\.4\.\d |2\.4\.\d |3\.4\.\d |4\.4\.\d )"),
}
# a span that continues another message (later lines of one exception, a hint's items)
_FRAGMENT = re.compile(
    r"^(?:reduce |to stop|Or use|\{stage\}|\{\w+\}: \{|\d+:\s|\s|Please refer|Previously created|…|"
    r"and |from |platform |, |has |does |It can be|\{(?:prefix|suggestion)\}|"
    r"Total GPU memory|Free GPU memory|<file>|trtllm-serve |was unable to fit|n_gpu_layers already|"
    r"model_params::|warning: (?:one possible|consult))"
)
_NEAR_BENIGN = re.compile(
    r"\((?:WARN|WARNING|INFO|DEBUG)\b|recoverable|\bWARN(?:ING)?\s*$|\bINFO(?: lines)?\s*$|not fatal"
)
# the catalogue's own words for a message that only points back at an earlier cause
_WRAPPER = re.compile(
    r"(?i)wrapper|look above|look for the|see the runner line|see the earlier error|printed earlier|"
    r"root cause (?:above|is printed)|\bwraps\b|depends$|^depends|crash(?:ed)?\b|died|internal consistency"
)
_WRAPPER_MSG = re.compile(
    r"(?i)terminate called|Check failed|Engine loop failed|Task <\w+> failed|failed to load model|"
    r"exiting due to|died|crashed|failed to start|hit an exception|Error when initializing model|"
    r"unexpectedly stopped|no longer running|\bterminated\b|Executor worker|signaled to shutdown|"
    r"channel disconnected|standard error output|errored already|had an error while processing|"
    r"error was encountered while running|unexpected error when creating|error loading model: \{|"
    r"error loading model: %s|failed to create[_ ]context|Server error: "
)
_CHAIN = re.compile(r"(?:\bthen\b|→|followed by|wrapped by|[Ww]rapper)[^`]*$")
_BENIGN_WORDS = re.compile(
    r"\(WARNING\)|\(WARN\b|\(INFO\)|\bINFO\b.*not|not fatal|Not fatal|[Nn]ot an error|[Bb]enign|recoverable|"
    r"Library diagnostics|process up|normal stop|lifespan done|handled by the scheduler|^Info\b|"
    r"Internal: another model|cache miss|Auto-increments|Not fatal by itself|Only printed when"
)


@dataclass
class Case:
    engine: str  # profile name
    section: str
    message: str  # the template as catalogued
    meaning: str
    expect: frozenset[str]  # classes that are right; empty: no failure at all
    line: str  # the message as a log line of its engine

    @property
    def benign(self) -> bool:
        return not self.expect


def _engine_of(chapter: str, section: str) -> str:
    c = chapter.lower()
    for name, key in (
        ("vllm", "vllm"),
        ("sglang", "sglang"),
        ("text generation inference", "tgi"),
        ("ollama", "ollama"),
        ("llama-server", "llamacpp"),
        ("lmdeploy", "lmdeploy"),
        ("tensorrt-llm", "trtllm"),
    ):
        if name in c:
            return key
    return "vllm"  # shared libraries: shown in vLLM's format


def _expect(section: str, message: str, meaning: str, before: str, after: str) -> frozenset[str]:
    """The classes this message's meaning implies: from its section, else its words."""
    if _NEAR_BENIGN.search(after[:40]) or _NEAR_BENIGN.search(before[-12:]) or _BENIGN_WORDS.search(meaning):
        return BENIGN
    if re.search(
        r"deprecated and will be removed|Inferred max batch|^Possible (?:solutions|suggestions)|debug info",
        message,
    ):
        return BENIGN  # notices and hints printed next to an error, not errors
    cls = _section_class(section, message, meaning)
    if _CHAIN.search(before) or _WRAPPER.search(meaning) or _WRAPPER_MSG.search(message):
        return cls | {"unknown_error"}  # a wrapper that points back at its cause: alone, unknown
    return cls


def _section_class(section: str, message: str, meaning: str) -> frozenset[str]:
    text = f"{message} {meaning}"
    s = section.lower()
    if re.search(
        r"Invalid argument|ArgumentValidation|must be [<>]=? `|cannot be < |must be greater than or equal|"
        r"is smaller than max_model_len|Both `|deprecated|[Ll]egacy flag|must be smaller than 1|"
        r"Invalid gpt_model_type|is not a known backend|orchestrator mode|unsupported backend|requires \"",
        message,
    ):
        return CONFIG  # a launch setting the engine refuses: no class of its own
    if re.search(r"(?i)placement group", message):
        return PARALLEL  # the cluster cannot place the ranks: not enough GPUs
    if re.search(r"(?i)timed out|timeout", message):
        return LIVENESS
    if re.search(r"(?i)compute capability|too old for|only supported on gpus", text):
        return DRIVER
    if "nccl" in s:
        return frozenset({"nccl"})
    if "pytorch cuda oom" in s:
        return frozenset({"oom"})
    if "http server" in s or "ports" in s:
        return PORT
    if "memory" in s:
        return MEMORY
    if "parallelism" in s:
        return PARALLEL
    if "driver" in s:
        return DRIVER
    if "request" in s and "model" not in s:
        return REQUEST
    if "liveness" in s:
        return LIVENESS
    if "model format" in s:
        return REQUEST if re.search(r"(?i)context length|prompt", text) else WEIGHTS
    # mixed tables (vLLM's model/config/request validation, SGLang's, TGI's): the message's own
    # words first, then the catalogue's meaning
    for t in (message, text):
        found = _by_words(t)
        if found is not None:
            return found
    return LIVENESS


def _by_words(text: str) -> frozenset[str] | None:
    if re.search(r"(?i)memory|\bOOM\b|KV capacity|KV cache|prefill tokens", text):
        return MEMORY
    if re.search(
        r"(?i)prompt|request|input tokens|context length|HTTP 4\d\d|max_new_tokens|max_tokens", text
    ):
        return REQUEST
    if re.search(
        r"(?i)architecture|quantiz|tokenizer|config|model type|unsupported|not supported|dtype|"
        r"download|remote code|sliding window|weights",
        text,
    ):
        return WEIGHTS
    if re.search(r"(?i)divisib|shard|world.?size|cuda devices|GPUs|\bTP\b|nnodes|one gpu", text):
        return PARALLEL
    if re.search(r"(?i)\bport\b|bind", text):
        return PORT
    if re.search(r"(?i)watchdog|no progress|timeout|timed out", text):
        return LIVENESS
    return None


_VALUES = {
    "port": "8000",
    "host": "0.0.0.0",
    "addr": "0.0.0.0:8000",
    "arch": "Qwen3NextForCausalLM",
    "architectures": "['Qwen3NextForCausalLM']",
    "archs": "['Qwen3NextForCausalLM']",
    "model_path": "/models/qwen",
    "path": "/models/qwen",
    "dtype": "bfloat16",
    "q": "awq",
    "quant": "fp8",
    "method": "awq",
    "device": "GPU",
    "device_str": "GPU",
    "device_name": "CUDA",
    "name": "scheduler",
    "err": "connection refused",
    "e": "CUDA out of memory",
    "error": "unhandled system error",
    "error_str": "unhandled system error",
    "msg": "failed",
    "backend": "turbomind",
    "component": "KV cache",
    "what": "x",
    "gpu_name": "Tesla T4",
}


def _fill(template: str, memory: bool = False) -> str:
    def brace(m: re.Match[str]) -> str:
        inner = m.group(1)
        if inner.endswith("="):  # Python's {x=}: the expression, then its value
            return f"{inner}3"
        if " " in inner.strip():  # a described variant ("{has compute capability X.Y}"): the words
            return inner.split("\\|")[0].replace("X.Y", "7.5")
        key = re.split(r"[:!=.\[(]", inner.strip(), maxsplit=1)[0]
        if key in _VALUES:
            return _VALUES[key]
        if ":" in inner and "f" in inner.split(":", 1)[1]:
            return "1.50"
        return "3"

    if memory:  # the error text of a memory failure is the runtime's "out of memory"
        template = re.sub(r"(failed: |error: |CUDA error: )(?:%s|\{\w+\})", r"\1out of memory", template)
    s = re.sub(r"\{([^{}]*)\}", brace, template)
    s = re.sub(r"%[-+#0]*\d*(?:\.\d+|\.\*)?(?:l|ll|z|h)?[dui]", "3", s)
    s = re.sub(r"%[-+#0]*\d*(?:\.\d+)?f", "1.50", s)
    s = re.sub(r"%[-+#0]*\d*(?:\.\*)?s", "x", s)
    s = re.sub(r"%v|%w", "x", s)
    s = s.replace("…", "x").replace("\\n", " ")
    return s


# a message raised as an exception: it reaches the log as the last line of a traceback
_RAISED = re.compile(r"\((?:[\w.]*?)?((?:[A-Z]\w*)?(?:Error|Exception))\b|\braise\b|\(assert|assertion\)")


def _as_lines(engine: str, text: str, raised: bool, level: str = "ERROR") -> str:
    if not raised or (engine in ("llamacpp", "trtllm") and text.startswith("[")):
        return _as_line(engine, text, level)
    py = {"tgi": "text_generation_server", "lmdeploy": "lmdeploy", "trtllm": "tensorrt_llm"}.get(
        engine, engine
    )
    frames = [
        "Traceback (most recent call last):",
        f'  File "/usr/lib/python3.12/site-packages/{py}/engine.py", line 10, in start',
        "    raise err",
        text,
    ]
    if engine == "vllm":
        return "\n".join(f"(EngineCore pid=100) ERROR 06-01 10:00:00 [core.py:1] {x}" for x in frames)
    if engine == "sglang":
        return "\n".join(f"[2025-06-01 10:00:00 TP0] {x}" if i == 0 else x for i, x in enumerate(frames))
    return "\n".join(frames)


def _as_line(engine: str, msg: str, level: str = "ERROR") -> str:
    lv = level[0]
    if engine == "vllm":
        return f"(EngineCore pid=100) {level} 06-01 10:00:00 [core.py:1] {msg}"
    if engine == "sglang":
        return f"[2025-06-01 10:00:00 TP0] {msg}"
    if engine == "tgi":
        return f"2025-06-01T10:00:00.000000Z {level} text_generation_launcher: {msg}"
    if engine == "ollama":
        if re.match(r"^(?:[a-z_]+: |CUDA error|ROCm error|ggml|llama|error:|  )", msg):
            return msg  # the runner's own lines are copied in bare
        quoted = msg.replace('"', '\\"')
        slog = "WARN" if level == "WARNING" else level
        return f'time=2025-06-01T10:00:00.000Z level={slog} source=server.go:1 msg="{quoted}"'
    if engine == "llamacpp":
        return msg if level == "ERROR" else f"0.00.100.000 {lv} {msg}"
    if engine == "lmdeploy":
        if msg.startswith("[TM]") or msg.startswith("[FT]"):
            return msg
        return f"2025-06-01 10:00:00,000 - lmdeploy - {level} - engine.py:1 - {msg}"
    if engine == "trtllm":
        if msg.startswith("[TensorRT-LLM]"):
            return msg
        return f"[06/01/2025-10:00:00] [TRT-LLM] [{lv}] {msg}"
    return msg


def cases() -> list[Case]:
    out: list[Case] = []
    for name in CATALOGUES:
        path = REFERENCE / name
        if not path.exists():
            continue
        chapter = section = ""
        for raw in path.read_text(encoding="utf-8").splitlines():
            if raw.startswith("## "):
                chapter = raw.strip("# ")
            if raw.startswith("#"):
                section = raw.lstrip("#").strip()
                continue
            if not raw.startswith("|") or raw.startswith(("|---", "| Message", "| #", "| Item", "| Range")):
                continue
            if not _TABLE_SECTIONS[name].match(section):
                continue
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", raw.strip())[1:-1]]
            if len(cells) < 2:
                continue
            first = cells[0]
            meaning = cells[2] if len(cells) > 2 else cells[1]
            for m in re.finditer(r"``\s?(.+?)\s?``|`([^`]+)`", first):
                msg = m.group(1) or m.group(2)
                if re.search(r"(?:for example|e\.g\.|such as)\s*$", first[: m.start()]):
                    continue  # an example value of a placeholder, not a message
                if len(msg.split()) < 3 or msg.startswith(("--", "...")) or msg.count("…") > 1:
                    continue
                if _FRAGMENT.match(msg):
                    continue
                engine = _engine_of(chapter, section)
                expect = _expect(section, msg, meaning, first[: m.start()], first[m.end() :])
                after = first[m.end() : m.end() + 40] + " " + (cells[1] if len(cells) > 2 else "")
                raised = _RAISED.search(after) if expect else None  # a notice is logged, not raised
                text = _fill(msg, memory=expect <= MEMORY | {"unknown_error"} and bool(expect))
                if raised and not re.match(r"^[A-Z]\w*(?:Error|Exception): ", text):
                    text = f"{raised.group(1) if raised.group(1) else 'RuntimeError'}: {text}"
                lines = _as_lines(engine, text, bool(raised), level="WARNING" if not expect else "ERROR")
                out.append(Case(engine, section, msg, meaning, expect, lines))
    return out


def judge(case: Case, know) -> tuple[bool, str]:  # type: ignore[no-untyped-def]
    """Is the tool right on this message as a one-line log? (ok, what it said)"""
    import os
    import tempfile

    from diagnose.pipeline.scan import scan_paths

    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False, encoding="utf-8") as f:
        f.write(case.line + "\n")
    try:
        d = scan_paths([f.name], know, engine=case.engine)
    finally:
        os.unlink(f.name)
    got = d.primary.cls if d.primary is not None else None
    fatal = any(x.severity == "fatal" for x in d.findings)
    if case.benign:
        return not fatal, f"{d.status}/{got}"
    return got in case.expect, f"{d.status}/{got}"


def coverage(know) -> tuple[float, list[tuple[Case, str]]]:  # type: ignore[no-untyped-def]
    all_cases = cases()
    misses = []
    for c in all_cases:
        ok, said = judge(c, know)
        if not ok:
            misses.append((c, said))
    return (1 - len(misses) / len(all_cases)) if all_cases else 1.0, misses


if __name__ == "__main__":
    from diagnose.knowledge.loaded import Knowledge

    cov, missed = coverage(Knowledge.load())
    for c, said in missed:
        want = "no failure" if c.benign else "/".join(sorted(c.expect))
        print(f"MISS {c.engine:8} {c.section[:28]:28} want {want:30} got {said:28} {c.line[:150]}")
    n = len(cases())
    print(f"catalogue coverage: {n - len(missed)}/{n} ({cov:.0%})")
