"""Memory: the values of the memory settings, and what to change for an OOM, a KV cache too
small for the context, and preemption under load."""

from __future__ import annotations

import math

from .core import UTIL_MAX, Advisor, as_float, as_int, len_down
from .data import advice_data
from .environment import free_gpu
from .parallelism import tp_valid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# the engines' capture steps, and torch's own CUDA-graph API (torch/cuda/graphs.py: CUDAGraph's
# capture_begin/capture_end under `with torch.cuda.graph(...)`, make_graphed_callables), which
# every engine's capture goes through
GRAPH_FRAMES = {
    "capture_model",
    "capture",
    "init_cuda_graphs",
    "CudaGraphRunner",
    "cuda_graph_runner",
    "capture_begin",
    "capture_end",
    "make_graphed_callables",
}
PROFILING_FRAMES = {"profile_run", "_dummy_run", "_dummy_sampler_run", "determine_num_available_blocks"}

# --- values --------------------------------------------------------------------------------


def gpu_memory_utilization(a: Advisor) -> None:
    if a.finding.cls == "kv_cache_too_small":
        a.util_raise("gives the KV cache more of each GPU")
    else:
        a.util_lower()


def max_num_seqs(a: Advisor) -> None:
    a.halve("max_num_seqs", 256, "fewer concurrent sequences need fewer KV blocks and less activation memory")


def max_num_batched_tokens(a: Advisor) -> None:
    a.halve(
        "max_num_batched_tokens",
        as_int(a.finding.facts.get("prefill_tokens")) or 8192,
        "smaller prefill chunks lower the activation peak",
        512,
    )


def cuda_graph_max_bs(a: Advisor) -> None:
    a.halve("cuda_graph_max_bs", 160, "smaller captured batches need less graph memory", 8)


def kv_cache_dtype(a: Advisor) -> None:
    cur = a.ctx.current("kv_cache_dtype")
    if str(cur or "auto").startswith("fp8"):
        return
    a.add("kv_cache_dtype", "fp8", "an fp8 KV cache holds twice the tokens in the same memory", cur)


def max_model_len(a: Advisor) -> None:
    cur = as_int(a.ctx.current("max_model_len"))
    if cur:
        a.add("max_model_len", len_down(cur // 2), "halves the longest sequence the KV cache must hold", cur)


def _layers_on_gpu(obs: dict[str, Any]) -> int | None:
    """The layers the runner put on the GPU, else those its scheduler planned there (Ollama)."""
    return as_int(obs.get("gpu_layers_offloaded", obs.get("gpu_layers_planned")))


def gpu_layers(a: Advisor) -> None:
    on_gpu = _layers_on_gpu(a.ctx.observed)
    if on_gpu:
        a.add(
            "gpu_layers",
            max(0, on_gpu * 3 // 4),
            f"{on_gpu} layers were on the GPU; a quarter fewer leave room",
            on_gpu,
        )
    else:
        a.add(
            "gpu_layers",
            "fewer than now (the log's 'offloaded N/M layers to GPU' line says how many)",
            "the layers placed on the GPU did not fit; the rest run on the CPU",
        )


def limit_mm_per_prompt(a: Advisor) -> None:
    if "limit_mm_per_prompt" in a.ctx.launch:
        a.add(
            "limit_mm_per_prompt",
            "fewer images/videos per prompt",
            "the profiling pass builds a dummy batch with the maximum multimodal inputs",
            a.ctx.launch["limit_mm_per_prompt"],
        )


VALUES = {
    "gpu_memory_utilization": gpu_memory_utilization,
    "max_num_seqs": max_num_seqs,
    "max_num_batched_tokens": max_num_batched_tokens,
    "cuda_graph_max_bs": cuda_graph_max_bs,
    "kv_cache_dtype": kv_cache_dtype,
    "max_model_len": max_model_len,
    "gpu_layers": gpu_layers,
    "limit_mm_per_prompt": limit_mm_per_prompt,
}

# --- the engine's order of candidates --------------------------------------------------------


def steps(a: Advisor, key: str, sub: str) -> list[dict[str, Any]]:
    """The ordered candidates for this situation: the engine's own table (its profile's
    `advice`, most specific key first), else the default one (rules/advice/advice.yaml)."""
    own = a.ctx.profiles.get(a.ctx.engine).advice
    for k in ([f"{key}.{sub}"] if sub else []) + [key]:
        if k in own:
            return own[k]
    default = advice_data().steps
    return default.get(f"{key}.{sub}") or default.get(key, [])


def apply_steps(a: Advisor, key: str, sub: str) -> None:
    for step in steps(a, key, sub):
        param, note = step["param"], step.get("note")
        if param == "gpu_memory_utilization":
            above = as_float(step.get("above"))
            if above is None or a.util_now() > above:
                a.util_lower(f" {note}" if note else "")
            continue
        a.note = note
        try:
            a.value(param)
        finally:
            a.note = None


# --- what the numbers say ----------------------------------------------------------------------


def seqs_that_fit(a: Advisor, dry: bool = False) -> int | None:
    """max_num_seqs from what the KV cache held at the last stats line: running ÷ usage."""
    obs = a.ctx.observed
    facts = a.finding.facts  # a serving verdict carries the stats line it stands on
    running = as_int(facts.get("running") if "running" in facts else obs.get("running"))
    usage = as_float(facts.get("kv_usage") if "kv_usage" in facts else obs.get("kv_usage"))
    if usage is None and obs.get("kv_usage_pct") is not None:
        usage = (as_float(obs["kv_usage_pct"]) or 0) / 100
    if not running or not usage or usage < 0.5:
        return None
    fit = int(running * 0.9 / usage)  # sequences of today's typical length at 90 % usage
    # the cap in force when the log says it; a default is no "was" (SGLang computes its own)
    known = (
        "max_num_seqs" in a.ctx.launch
        or "max_num_seqs" in obs
        or "max_num_seqs" in a.ctx.profiles.get(a.ctx.engine).defaults
    )
    cur = as_int(a.ctx.current("max_num_seqs")) if known else None
    if fit < 1 or (cur is not None and fit >= cur):
        return None
    if dry:
        return fit
    tokens = obs.get("kv_tokens")
    per = f" (~{int(usage * tokens / running)} tokens each)" if tokens else ""
    a.add(
        "max_num_seqs",
        fit,
        f"{running} running requests{per} filled {usage:.0%} of the KV cache; {fit} leave 10 % headroom",
        cur,
    )
    return fit


def weight_gib_at(shape: Any, tp: int) -> float:
    from ..budget.units import GIB
    from ..budget.weights import weight_bytes

    return weight_bytes(shape) / tp / GIB


def tp_from_budget(a: Advisor) -> None:
    """With config.json: the smallest tensor-parallel size whose weights fit, else fp8 weights."""
    s = a.ctx.shape
    total = as_float(a.finding.facts.get("total_gib"))
    if s is None or total is None:
        return
    from ..budget.search import plan
    from ..budget.units import engine_units

    engine = a.ctx.engine if a.ctx.engine in a.ctx.profiles.by_engine else "generic"
    units = engine_units(engine, a.ctx.profiles)
    if units.kv_budget == "layers":
        return  # layer-offload engines have no parallel size: their advice is GPU layers
    gpus = a.ctx.visible_gpus or 8
    cur = as_int(a.ctx.current("tensor_parallel_size")) or 1
    util = as_float(a.ctx.current("gpu_memory_utilization"))  # in the engine's own units
    max_len = as_int(a.ctx.current("max_model_len")) or 4096
    p = plan(s, gpus, total, util=util, max_model_len=max_len, units=units)
    if p.fits and p.tp <= cur:
        # the arithmetic says it fits as launched: the memory went elsewhere
        a.add(
            "action:free_gpu",
            "stop whatever else uses the GPU (see `nvidia-smi`)",
            f"config.json: the weights need only {weight_gib_at(s, cur):.1f} GiB per GPU at "
            f"tensor_parallel_size {cur}, which fits {total:g} GiB; something else held the memory",
        )
    elif p.fits:
        a.add(
            "tensor_parallel_size",
            p.tp,
            f"config.json: the weights take {p.weights_gib_per_gpu:.1f} GiB "
            f"per GPU at {p.tp} GPUs of {total:g} GiB (and {s.heads} heads divide evenly)",
            cur,
        )
    else:
        a.add(
            "quantization",
            "fp8",
            f"config.json: no parallel size on {gpus} GPUs of {total:g} GiB holds "
            f"{s.params_total / 1e9:.1f} B parameters in {s.dtype_bytes:g}-byte weights",
            a.ctx.current("quantization"),
        )


def weights_fill_budget(a: Advisor) -> str | None:
    """The weights alone take (nearly) all the memory the engine may use: why, or None."""
    weights = as_float(a.ctx.observed.get("weights_gib"))
    total = as_float(a.finding.facts.get("total_gib") or a.ctx.observed.get("gpu_total_gib"))
    util = a.util_now()
    if weights and total and weights >= 0.8 * util * total:
        return (
            f"the weights take {weights:g} GiB of the {util * total:.1f} GiB the engine may use "
            f"({util:g} × {total:g} GiB): nothing is left to profile or cache"
        )
    return None


# --- per class -----------------------------------------------------------------------------


def kv_cache_too_small(a: Advisor) -> None:
    f = a.finding
    est = as_int(f.facts.get("est_max_len") or f.facts.get("kv_tokens"))
    cur = as_int(f.facts.get("max_model_len")) or as_int(a.ctx.current("max_model_len"))
    need, avail = as_float(f.facts.get("needed_gib")), as_float(f.facts.get("available_gib"))
    if (est is not None and est <= 0) or (avail is not None and avail <= 0):
        # the weights and activations left nothing (or less) for the KV cache: no context length
        # fits, so what must shrink is what each GPU holds before the cache
        tp_valid(a, want_more=True)
        a.value("quantization")
        a.util_raise("gives the KV cache more of each GPU")
        return
    if not est and cur and need and avail and avail > 0:
        est = int(cur * avail / need)  # KV memory grows linearly with the length
    if est and (cur is None or est < cur):
        a.add(
            "max_model_len", len_down(est), f"the KV cache holds about {est} tokens; {cur} does not fit", cur
        )
    frac = as_float(f.facts.get("min_fraction"))
    if frac:
        to = min(UTIL_MAX, math.ceil((frac + 0.01) / 0.01) * 0.01)
        a.add(
            "gpu_memory_utilization",
            round(to, 2),
            f"the log says the minimum viable fraction is {frac}",
            as_float(f.facts.get("mem_fraction_static2")),
        )
    if f.facts.get("max_total_tokens"):  # TGI names the total tokens one request may take
        n = as_int(f.facts["max_total_tokens"]) or 0
        a.add("max_model_len", len_down(n // 2), f"{n} total tokens per request do not fit the KV blocks", n)
    a.util_raise("gives the KV cache more of each GPU")
    a.value("kv_cache_dtype")
    tp_valid(a, want_more=True)


def oom_layered(a: Advisor) -> None:
    """Engines that place layers on the GPU (llama.cpp, Ollama): the weights' share is the
    layer count, the KV cache and compute buffers follow the context size."""
    f = a.finding
    if f.oom_phase == "load":
        _fewer_layers(a)
        a.value("model")
        return
    _shorter_context(a)
    if f.oom_phase == "startup" and "compute" in f.rule:
        a.halve("max_num_batched_tokens", 512, "the compute buffer grows with the micro-batch", 64)
    if a.has("kv_cache_dtype") and str(a.ctx.current("kv_cache_dtype") or "f16") in ("f16", "auto"):
        a.add("kv_cache_dtype", "q8_0", "a q8_0 KV cache takes half the memory of f16", "f16")
    _fewer_layers(a)


def _fewer_layers(a: Advisor) -> None:
    obs = a.ctx.observed
    on_gpu = _layers_on_gpu(obs) or as_int(a.ctx.current("gpu_layers"))
    layers = as_int(obs.get("gpu_layers_total"))
    if not on_gpu:
        gpu_layers(a)
        return
    of = f" of {layers}" if layers else ""
    a.add(
        "gpu_layers",
        max(0, on_gpu * 3 // 4),
        f"{on_gpu}{of} layers were placed on the GPU; about a quarter fewer leave room "
        "(the rest run on the CPU, slower)",
        on_gpu,
    )


def _shorter_context(a: Advisor) -> None:
    obs = a.ctx.observed
    ctx_now = (
        as_int(obs.get("n_ctx"))
        or as_int(obs.get("n_ctx_per_seq"))  # one slot: the whole context
        or as_int(a.ctx.current("max_model_len"))
    )
    if ctx_now:
        a.add(
            "max_model_len",
            len_down(ctx_now // 2),
            f"the KV cache and compute buffers grow with the context ({ctx_now} tokens); half needs half",
            ctx_now,
        )
    else:
        a.add(
            "max_model_len",
            "half the context now in use (the 'n_ctx' line shows it)",
            "the KV cache and compute buffers grow with the context",
        )


def oom(a: Advisor) -> None:
    if a.has("gpu_layers"):
        oom_layered(a)
    elif a.finding.oom_phase == "load":
        _oom_load(a)
    elif a.finding.oom_phase == "startup":
        _oom_startup(a)
    else:
        _oom_runtime(a)


def _another_process(a: Advisor) -> bool:
    return bool(a.finding.facts.get("other_pid") and a.finding.facts.get("self_listed"))


def _oom_load(a: Advisor) -> None:
    f = a.finding
    if _another_process(a):
        free_gpu(a)
        a.value("env:CUDA_VISIBLE_DEVICES")
    tp = as_int(a.ctx.current("tensor_parallel_size")) or 1
    total = as_float(f.facts.get("total_gib"))
    gpus = a.ctx.visible_gpus
    if gpus == 1 or (gpus is None and tp == 1 and total is not None and total <= 32):
        # one consumer card: there is no second GPU to split over; fewer bytes per weight is the way
        a.value("quantization")
        a.add(
            "model",
            "a smaller or pre-quantised checkpoint (AWQ/GPTQ int4)",
            f"the weights do not fit one {total:g} GiB GPU" if total else "the weights do not fit one GPU",
        )
        if a.has("cpu_offload_gb"):
            a.add(
                "cpu_offload_gb",
                max(2, int(total // 4)) if total else 4,
                "keeps part of the weights in CPU memory (slower, but it loads)",
                a.ctx.current("cpu_offload_gb"),
            )
    tp_from_budget(a)
    tp_valid(a, want_more=True)
    a.value("quantization")
    free_gpu(a)
    # the weights did not fit: a smaller KV budget or fewer sequences cannot help
    a.complete = True


def _oom_startup(a: Advisor) -> None:
    f = a.finding
    full = weights_fill_budget(a)
    if full:
        a.value("quantization")
        a.add("model", "a smaller or pre-quantised checkpoint (AWQ/GPTQ int4)", full)
    if _another_process(a):
        free_gpu(a)
    frames = a.ctx.frames
    graphs = f.phase_at == "cuda_graphs" or bool(frames & GRAPH_FRAMES) or "graph" in f.rule
    profiling = f.phase_at in (None, "weights_loaded", "load_weights") or bool(frames & PROFILING_FRAMES)
    apply_steps(a, "oom.startup", "graphs" if graphs else "profiling" if profiling else "")


def _oom_runtime(a: Advisor) -> None:
    """Fragmentation first, whatever the engine."""
    f = a.finding
    uptime = as_float(f.facts.get("uptime_s")) or 0.0
    if uptime >= 3600:
        a.add(
            "env:PYTORCH_CUDA_ALLOC_CONF",
            "expandable_segments:True",
            f"the server ran {uptime / 3600:.1f} h before this OOM: fragmentation, not the load, is the usual cause",
        )
    reserved = as_float(f.facts.get("reserved_unallocated_gib")) or 0.0
    total = as_float(f.facts.get("total_gib")) or 0.0
    if reserved >= 1.0 or (total and reserved >= 0.05 * total):
        a.add(
            "env:PYTORCH_CUDA_ALLOC_CONF",
            "expandable_segments:True",
            f"{reserved} GiB are reserved but unallocated: the memory is fragmented",
        )
    if as_int(a.ctx.observed.get("running")) == 0:
        # no request was running: not the batch, but the engine's own pool (a wake-up mapping it
        # back, a resize) did not fit what is left of the GPU; fewer or shorter requests cannot help
        a.util_lower(" for the pool to fit beside what else holds the GPU")
        free_gpu(a)
        a.complete = True  # the rule's batch knobs cannot help either
        return
    apply_steps(a, "oom.runtime", "")


def preemption(a: Advisor) -> None:
    fit = seqs_that_fit(a, dry=True)
    if fit is not None and fit < 8:
        # a handful of very long sequences: capping concurrency would starve the server
        a.util_raise("more KV cache means fewer preemptions")
    seqs_that_fit(a)
    a.value("max_num_seqs")
    a.util_raise("more KV cache means fewer preemptions")
    a.value("kv_cache_dtype")


CLASSES = {"oom": oom, "kv_cache_too_small": kv_cache_too_small, "preemption": preemption}
