"""Advice values: the grids, the bounds, and properties no advice may break."""

from __future__ import annotations

import itertools

import pytest

from diagnose.advice import advise, divisors_at_most, len_down, util_down, util_up
from diagnose.model import Finding


def test_utilisation_grid():
    assert (
        util_down(0.95) == 0.90
        and util_down(0.99) == 0.95
        and util_down(0.9) == 0.85
        and util_down(0.92) == 0.90
    )
    assert util_up(0.9) == 0.95 and util_up(0.89) == 0.90 and util_up(0.95) is None and util_up(0.97) is None


def test_context_length_rounding():
    assert len_down(69000) == 65536  # the example: 131072 → 65536
    assert len_down(121840) == 120832 and len_down(23648) == 23552 and len_down(4096) == 4096
    for n in range(1024, 300_000, 997):
        v = len_down(n)
        assert v <= n and v % 1024 == 0 and v > 0


def _f(cls, **facts):
    return Finding(
        rule="t", cls=cls, severity="fatal", title="t", line=1, source="s", evidence="e", facts=facts
    )


@pytest.mark.parametrize(
    "heads,gpus,tp",
    list(itertools.product([8, 12, 14, 16, 28, 32, 40, 64, 96], [1, 2, 3, 4, 6, 8], [3, 5, 6, 7, 12])),
)
def test_parallel_size_never_exceeds_gpus_or_breaks_heads(know, heads, gpus, tp):
    f = _f("tp_mismatch", heads=heads, gpus=gpus, tensor_parallel_size=tp)
    for c in advise(f, "vllm", {"tensor_parallel_size": tp}, know.profiles):
        if c.param == "tensor_parallel_size":
            v = int(c.to)
            assert v <= gpus and heads % v == 0 and v >= 1


@pytest.mark.parametrize("util", [0.5, 0.85, 0.9, 0.92, 0.95, 0.97, 0.99])
@pytest.mark.parametrize(
    "cls,phase",
    [
        ("oom", "startup"),
        ("oom", "runtime"),
        ("kv_cache_too_small", "startup"),
        ("preemption", None),
        ("gpu_busy", None),
    ],
)
def test_utilisation_never_above_095(know, util, cls, phase):
    f = _f(cls, free_gib=30.0, total_gib=79.19)
    f.oom_phase = phase
    for c in advise(f, "vllm", {"gpu_memory_utilization": util}, know.profiles):
        if c.param == "gpu_memory_utilization":
            v = float(c.to)
            assert v <= 0.95 and round(v * 100) % 5 == 0


@pytest.mark.parametrize("est,cur", [(69000, 131072), (121840, 262144), (23648, 29000), (1500, 4096)])
def test_max_model_len_at_or_below_what_fits(know, est, cur):
    f = _f("kv_cache_too_small", est_max_len=est, max_model_len=cur)
    first = advise(f, "vllm", {}, know.profiles)[0]
    assert first.param == "max_model_len" and first.flag == "--max-model-len"
    assert int(first.to) <= est and first.frm == str(cur)


def test_engine_spelling_of_flags(know):
    f = _f("kv_cache_too_small", mem_fraction_static=0.7)
    first = advise(f, "sglang", {"gpu_memory_utilization": 0.7}, know.profiles)[0]
    assert (first.param, first.flag, first.frm, first.to) == (
        "gpu_memory_utilization",
        "--mem-fraction-static",
        "0.70",
        "0.75",
    )
    f = _f("tp_mismatch", heads=32, tensor_parallel_size=3)
    first = advise(f, "tgi", {}, know.profiles)[0]
    assert first.flag == "--num-shard" and first.to == "2"


def test_divisors():
    assert divisors_at_most(16, 6) == [1, 2, 4] and divisors_at_most(40, 8) == [1, 2, 4, 5, 8]


def test_no_advice_without_a_finding(know):
    assert advise(None, "vllm", {}, know.profiles) == []


@pytest.mark.parametrize("phase", ["load", "startup", "runtime"])
def test_generic_engine_gets_its_own_keys_first(know, phase):
    """The seed guides' engine has a few config keys: those come first, vLLM-only flags after,
    marked as a guess. A vLLM log keeps the class logic's order untouched."""
    f = _f("oom", tried_gib=2.0)
    f.oom_phase = phase
    launch = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.9, "max_num_seqs": 8}
    changes = advise(f, "generic", launch, know.profiles)
    declared = know.profiles.get("generic").flags
    known = [c.param in declared or c.param.startswith(("env:", "action:")) for c in changes]
    assert changes and known == sorted(known, reverse=True)
    for c, k in zip(changes, known, strict=True):
        assert k or (c.flag.startswith("--") and "skip it if your engine" in c.why)
    vllm = advise(f, "vllm", launch, know.profiles)
    assert all("skip it if your engine" not in c.why for c in vllm)


def test_no_other_process_to_stop_when_the_failing_one_holds_the_memory(know):
    # "GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free. Including non-PyTorch
    # memory, this process has 78.16 GiB memory in use": nobody else is on the GPU
    alone = _f("oom", total_gib=79.19, free_gib=1.02, process_gib=78.16, self_listed=True)
    alone.oom_phase = "load"
    assert "action:free_gpu" not in [c.param for c in advise(alone, "vllm", {}, know.profiles)]
    # the same GPU with 30 GiB unaccounted for by this process: someone else holds it
    shared = _f("oom", total_gib=79.19, free_gib=1.02, process_gib=48.16, self_listed=True)
    shared.oom_phase = "load"
    assert "action:free_gpu" in [c.param for c in advise(shared, "vllm", {}, know.profiles)]
