"""A line split by the plan of a line of its shape (read/prefixes.py: its digits aside, every
layer reads any digit alike) gets exactly the fields splitting it afresh gives: on every real
and fixture line, on generated lines whose digits change, and across a learned wrapper."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.knowledge.loaded import Knowledge
from diagnose.model.records import Line
from diagnose.read.prefixes import Layout
from diagnose.search.pattern_tree import digit_blind

from .conftest import FIXTURES, REAL_LOGS

FIELDS = ("level", "timestamp", "pid", "process", "rank", "location", "message")
KNOW = Knowledge.load()


def _fields(layout: Layout, source: str, text: str) -> tuple[object, ...]:
    line = layout.split(Line(source=source, number=1, text=text))
    return tuple(getattr(line, k) for k in FIELDS)


def _fresh_without_plans() -> Layout:
    lay = KNOW.profiles.layout.fresh()
    lay._plans, lay._blind = {}, [False]  # its own: no plan is made or read
    return lay


def _lines() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    paths = sorted(FIXTURES.glob("logs/*/*.log")) + sorted(REAL_LOGS.glob("*/log.txt"))
    for p in paths:
        out += [(str(p), t) for t in p.read_text(errors="replace").splitlines()]
    return out


def test_every_shipped_layer_reads_any_digit_alike() -> None:
    assert all(digit_blind(p) for p in KNOW.profiles.layout.prefixes)


def test_a_layer_that_reads_one_digit_is_not_blind_to_digits() -> None:
    assert digit_blind(re.compile(r"\[rank(\d+)\] \w+ [0-9a-f]+ \S+"))
    assert not digit_blind(re.compile(r"\[rank0\]"))
    assert not digit_blind(re.compile(r"TP[1-7] "))
    assert not digit_blind(re.compile(r"(\d+)-\1"))  # a back-reference compares the digits
    assert not digit_blind(re.compile(r"(?<!1)x"))


def test_plans_give_the_fields_a_fresh_split_gives_on_every_real_line() -> None:
    """Every line twice (the second from a plan where its shape was split before), each source
    with its own learned wrappers, against a layout that keeps no plan."""
    lines = _lines()
    planned, plain = KNOW.profiles.layout.fresh(), _fresh_without_plans()
    planned._plans, planned._splits = {}, [0]  # (this test's own: plans from its 201st line)
    for source, text in lines + lines:
        assert _fields(planned, source, text) == _fields(plain, source, text), text[:160]
    assert len(planned._plans) > 1_000


_TEMPLATES = [
    "(EngineCore_0 pid={0}) ERROR 09-0{1} 11:0{2}:37 [core.py:7{3}] EngineCore failed to start.",
    "(VllmWorker rank={1} pid={0}) INFO 01-23 1{2}:34:56 [gpu_worker.py:2{3}] Memory profiling took {0} s",
    "[2025-03-07 0{1}:23:53 TP{1}] Decode out of memory happened. #retracted_reqs: {3}",
    '[rank{1}]:   File "/usr/lib/python3/site.py", line {0}, in run',
    "2026-04-28 11:0{1}:38,266 - lmdeploy - WARNING - turbomind.py:{0} - get {3} model params",
    "W0803 21:48:4{1}.773000 {0} torch/_inductor/utils.py:1731] not enough SMs",
    "{0}\tINFO 01-23 10:00:0{1} [x.py:{3}] cat -n and a vLLM line",
    'time=2025-01-0{1}T10:00:00Z level=ERROR source=server.go:{0} msg="llama runner process has terminated"',
    'Thu Jan 23 11:55:5{1} 2025[1,{1}]<stderr>:  File "/x.py", line {0}',
    "slot update_slots: id  {1} | task {0} | new prompt, n_ctx_slot = {3}",
]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(_TEMPLATES), st.lists(st.integers(0, 99999), min_size=4, max_size=4)),
        min_size=1,
        max_size=20,
    ),
    st.sampled_from(["", "myapp | ", "[pod/vllm-7d9f8c-abcde/vllm] ", "12\t"]),
)
def test_plans_on_lines_whose_digits_change(lines, wrapper) -> None:  # type: ignore[no-untyped-def]
    planned, plain = KNOW.profiles.layout.fresh(), _fresh_without_plans()
    planned._plans, planned._splits = {}, [10**6]  # (plans are kept past DISPATCH_AFTER lines)
    for template, nums in lines:
        text = wrapper + template.format(*nums)
        assert _fields(planned, "s", text) == _fields(plain, "s", text), text


def test_a_user_layer_on_regex_is_always_tried_and_keeps_no_plan() -> None:
    """A user profile's prefix runs on `regex` (a TimedPattern): past the lines after which
    layers are chosen by first character (DISPATCH_AFTER) it is still tried, and no plan is
    kept for it (its syntax is not `re`'s to read)."""
    from diagnose.search.patterns import timed_pattern

    lay = Layout([timed_pattern(r"(?P<ts>\d\d:\d\d:\d\d) (?P<level>[A-Z]+) ")]).fresh()
    for i in range(300):
        line = lay.split(Line(source="s", number=i, text=f"10:00:{i % 60:02d} ERROR x{i}"))
        assert (line.timestamp, line.level, line.message) == (f"10:00:{i % 60:02d}", "ERROR", f"x{i}")
    assert lay._blind == [False] and not lay._plans
