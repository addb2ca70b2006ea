"""Real logs as they reach a user through collectors and terminals read the same as the raw
files: the same status, class and OOM phase. Each wrapper is applied to every line of a
sample of ../shared/real-logs (every third log, all engines)."""

from __future__ import annotations

import json

import pytest

from .conftest import SHARED

LOGS = sorted((SHARED / "real-logs").glob("*/log.txt"))[::3]


def _time(i: int) -> str:
    return f"10:{i // 60 % 60:02d}:{i % 60:02d}"


WRAPPERS = {
    "docker compose": lambda x, i: "vllm-1  | " + x,
    "compose with colour": lambda x, i: "\x1b[36mllm-server-1  |\x1b[0m " + x,
    "kubectl --prefix": lambda x, i: "[pod/vllm-7d9f8c-abcde/vllm] " + x,
    "journald": lambda x, i: f"Mar 01 {_time(i)} gpu-host-01 python3[4242]: " + x,
    "journald short-iso": lambda x, i: f"2025-03-01T{_time(i)}+0000 gpu-host-01 python3[4242]: " + x,
    "docker json-file": lambda x, i: json.dumps(
        {"log": x + "\n", "stream": "stderr", "time": f"2025-03-01T{_time(i)}.000000000Z"}
    ),
    "cat -n": lambda x, i: f"{i + 1:6d}\t" + x,
    "kubernetes CRI file": lambda x, i: f"2025-03-01T{_time(i)}.123456789Z stderr F " + x,
    "markdown indent": lambda x, i: "    " + x,
    "CRLF": lambda x, i: x + "\r",
    # a wrapper nobody documents (stern's "pod container"): learned from the lines whose own
    # layout follows it, then peeled from the source's other lines too
    "unknown constant wrapper": lambda x, i: "vllm-0 vllm " + x,
}


# (wrapper, log) -> why that wrapped log still reads otherwise than the raw one. Checked both
# ways: a listed pair that reads alike again fails the test until it is taken off the list.
KNOWN_DIFFS: dict[tuple[str, str], str] = {
    **{
        (w, "sglang-012-retraction-throughput-collapse-swa"): (
            "the collector's clock (one line a second in this test) outranks the engine's own in the "
            "serving series, so the stats lines' spacing, and with it the KV-full-while-queueing "
            "verdict, is the wrapper's"
        )
        for w in ("docker json-file", "journald short-iso", "kubernetes CRI file")
    },
    ("docker json-file", "vllm-218-hang-startup-hf-hub-list-repo-tree-tokenizer-cpu-v0210"): (
        "CPython 3.14's coloured traceback (a Ctrl-C) inside JSON records: the escaped colour codes "
        "hide its frames, so the raw log's stop reads as a traceback cut before its exception"
    ),
    ("unknown constant wrapper", "sglang-018-deepep-assert-during-graph-capture"): (
        "six lines, none of them in a layout the learner knows: the constant prefix is never "
        "learned, so the bare exception line does not start with its exception"
    ),
    ("unknown constant wrapper", "sglang-214-oom_load-mixtral-8x7b-single-gpu-tp-not-set"): (
        "the load marker's line is read before the constant prefix is learned, so the OOM has no "
        "timeline to take its phase from"
    ),
}


def _verdict(know, path) -> tuple:  # type: ignore[no-untyped-def,type-arg]
    from diagnose.pipeline.scan import scan_paths

    d = scan_paths([str(path)], know)
    p = d.primary
    return d.status, p.cls if p else None, p.oom_phase if p else None


@pytest.mark.skipif(not LOGS, reason="../shared/real-logs is not here")
@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_a_wrapped_real_log_reads_like_the_raw_one(wrapper, know, tmp_path):  # type: ignore[no-untyped-def]
    wrap = WRAPPERS[wrapper]
    differ = []
    for log in LOGS:
        lines = log.read_text(errors="replace").split("\n")
        out = tmp_path / "wrapped.log"
        out.write_text("\n".join(wrap(x, i) for i, x in enumerate(lines)), errors="replace")
        raw, wrapped = _verdict(know, log), _verdict(know, out)
        known = (wrapper, log.parent.name) in KNOWN_DIFFS
        if (raw != wrapped) != known:
            differ.append(f"{log.parent.name}: {raw} -> {wrapped}" + (" (listed as known)" if known else ""))
    assert not differ, "\n".join(differ)
