"""The search: `plan` tries the parallel sizes that divide the heads on the GPUs given, then what
would fit instead (context, KV dtype, utilisation, quantisation, more GPUs) is worked out by
the same evaluation that judged the launch.
"""

from __future__ import annotations

import dataclasses
import re

from ..base.errors import InputError
from .activation import engine_defaults, profiled_tokens
from .evaluate import evaluate, variant
from .plan import Plan
from .shape import ModelShape
from .units import GGUF_DEFAULT, GGUF_TYPES, GIB, QUANT_BYTES, EngineUnits, engine_units
from .weights import weight_bytes


def plan(
    s: ModelShape,
    gpus: int,
    gpu_total_gib: float,
    used_gib: float = 0.0,
    tp: int | None = None,
    pp: int = 1,
    util: float | None = None,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    kv_dtype: str = "auto",
    engine: str = "vllm",
    gpu_name: str | None = None,
    engine_version: str | None = None,
    chunked_prefill: bool | None = None,
    eager: bool = False,
    units: EngineUnits | None = None,
) -> Plan:
    units = units or engine_units(engine)
    engine = units.engine
    if util is None:
        if units.defaults.get("gpu_memory_utilization") is None:
            raise InputError(f"{engine}: no gpu_memory_utilization default in its profile or the generic one")
        util = float(units.defaults["gpu_memory_utilization"])
    s, gguf_note = _as_gguf(s) if units.kv_budget == "layers" else (s, None)
    length, seqs = _length_and_seqs(
        s, units, max_model_len, max_num_seqs, engine_version, gpu_total_gib, gpu_name
    )
    own_batch = units.defaults.get("max_num_batched_tokens") if units.profile != "dummy_batch" else None
    if own_batch and not max_num_batched_tokens:
        batched, batched_why = int(own_batch), f"{engine}: {own_batch} tokens a prefill step (its default)"
    else:
        batched, batched_why = profiled_tokens(
            units, engine_version, chunked_prefill, max_num_batched_tokens, length, gpu_total_gib, gpu_name
        )
    base = Plan(
        s,
        gpus,
        gpu_total_gib,
        used_gib,
        tp or 1,
        pp,
        util,
        length,
        seqs,
        batched,
        kv_dtype,
        engine,
        units,
        gpu_name=gpu_name,
        engine_version=engine_version,
        eager=eager,
    )
    if units.kv_budget == "layers":
        base.tp = tp or 1
        chosen = evaluate(base)
        if not chosen.fits:
            chosen.what_would = _what_would_layers(chosen)
        if gguf_note:
            chosen.assumptions.insert(0, gguf_note)
        return chosen
    candidates = [tp] if tp else [t for t in range(1, max(1, gpus // pp) + 1) if s.heads % t == 0]
    chosen = base
    for t in candidates:
        chosen = variant(base, tp=t)
        if chosen.fits:
            break
    if not chosen.fits:
        chosen.what_would = _what_would(chosen)
    chosen.assumptions.insert(0, batched_why)
    if not max_num_seqs:
        chosen.assumptions.insert(1, f"max_num_seqs={seqs}: the engine's default")
    return chosen


def _as_gguf(s: ModelShape) -> tuple[ModelShape, str | None]:
    """Layer-offload engines read GGUF files: weights in a GGUF type (Q4_K_M when the shape
    names none), and the note that says so."""
    if s.quant in GGUF_TYPES:
        return s, None
    note = (
        f"weights as GGUF {GGUF_DEFAULT.upper()} ({QUANT_BYTES[GGUF_DEFAULT] * 8:.2f} bits a weight)"
        + (f", not {s.quant}" if s.quant else "")
        + ": give --quantization q8_0, q6_k, q5_k_m, q4_0… for the file's own type"
    )
    return dataclasses.replace(s, quant=GGUF_DEFAULT, exact_bytes=None, exact_from=None), note


def _length_and_seqs(
    s: ModelShape,
    units: EngineUnits,
    max_model_len: int | None,
    max_num_seqs: int | None,
    engine_version: str | None,
    gpu_total_gib: float,
    gpu_name: str | None,
) -> tuple[int, int]:
    """The context length and concurrent sequences planned for: given, else the engine's defaults."""
    if units.kv_budget == "layers":
        length = int(
            max_model_len or units.defaults.get("max_model_len") or min(4096, s.max_position or 4096)
        )
        default_seqs = int(units.defaults.get("max_num_seqs") or 1)
    else:
        length = int(max_model_len or s.max_position or 4096)
        _, default_seqs, _ = engine_defaults(units, engine_version, gpu_total_gib, gpu_name)
        if units.profile != "dummy_batch" and units.defaults.get("max_num_seqs"):
            default_seqs = int(units.defaults["max_num_seqs"])
    return length, max_num_seqs or default_seqs


def longest_context(q: Plan) -> tuple[Plan, int | None]:
    """The plan if it fits; else, when its weights fit and only the context does not, the same
    plan at the longest context its KV cache holds (and that length); else the plan, None."""
    if q.fits or q.kv_gib_per_gpu < 0:
        return q, None
    shorter = min(q.kv_tokens // 1024 * 1024, q.shape.max_position or q.max_model_len)
    if 1024 <= shorter < q.max_model_len:
        r = variant(q, max_model_len=shorter)
        if r.fits:
            return r, shorter
    return q, None


def with_auto_context(p: Plan, asked: int | None) -> tuple[Plan, int | None]:
    """The question `plan` answers when no context was asked: at what context does it fit? The
    plan at the longest one, as `--max-model-len auto` picks it, when the model's own length is
    all that does not fit; (that plan, the length), else (p, None)."""
    if asked is not None or p.fits or p.units.kv_budget == "layers":
        return p, None
    q, auto = longest_context(p)
    if auto:
        q.assumptions.insert(
            0,
            f"max_model_len {auto}: the longest context that fits (as --max-model-len auto picks it); "
            f"the model's own {p.shape.max_position or p.max_model_len} does not",
        )
    return q, auto


def fitting_share(p: Plan) -> float | None:
    """When the activations do not fit beside the engine's KV share: the largest share, in 0.05
    steps, with which the plan fits; None otherwise."""
    if not any(r.startswith("activations need") for r in p.reasons):
        return None
    for step in range(int(p.util * 20) - 1, 5, -1):
        if variant(p, util=step / 20).fits:
            return step / 20
    return None


def _what_would(p: Plan) -> list[str]:
    """When nothing fits: the nearest launches that would, in the engine's own flags."""
    s = p.shape
    flags = p.units.flags
    ctx_flag = flags.get("max_model_len", "--max-model-len")
    out: list[str] = []
    fp8 = fp8_supported(p.gpu_name)
    q, shorter = longest_context(p)
    if shorter:
        out.append(f"a shorter context: {ctx_flag} {shorter} at tp={p.tp}")
    share = fitting_share(p)
    if share:
        util_flag = flags.get("gpu_memory_utilization", "gpu_memory_utilization")
        out.append(f"a smaller KV share: {util_flag} {share:.2f} leaves the activations room")
    kv_flag = flags.get("kv_cache_dtype")
    if p.kv_dtype in ("auto", "") and not s.mla and fp8 is not False and kv_flag:
        q = variant(p, kv_dtype="fp8")
        if q.fits:
            out.append(f"an fp8 KV cache ({kv_flag} fp8) at tp={p.tp}: {q.kv_tokens:,} tokens")
    valid_tps = [t for t in range(1, max(1, p.gpus // p.pp) + 1) if s.heads % t == 0]
    if s.quant is None:
        for method in ("fp8", "int4") if fp8 is not False else ("int4",):
            found = None
            for t in valid_tps:
                q, shorter = longest_context(variant(p, shape=dataclasses.replace(s, quant=method), tp=t))
                if q.fits:
                    found = (q, shorter)
                    break
            if found:
                q, shorter = found
                out.append(
                    f"{method} weights ({q.weights_gib_per_gpu:.1f} GiB per GPU) at tp={q.tp}"
                    + (f" with {ctx_flag} {shorter}" if shorter else "")
                )
                if not shorter:
                    break
    for t in [t for t in range(p.gpus + 1, 65) if s.heads % t == 0 and t & (t - 1) == 0]:
        q, shorter = longest_context(variant(p, tp=t, gpus=t * p.pp))
        if q.fits:
            out.append(
                f"more GPUs: tp={t} on {t * p.pp} GPUs of {round(p.gpu_total_gib, 1):g} GiB"
                + (f" with {ctx_flag} {shorter}" if shorter else "")
            )
            if not shorter:
                break
    return out


def _what_would_layers(p: Plan) -> list[str]:
    s, units = p.shape, p.units
    out: list[str] = []
    ctx_flag = units.flags.get("max_model_len", "max_model_len")
    length = p.max_model_len // 1024 * 1024
    while length >= 1024:
        q = variant(p, max_model_len=length)
        if q.fits:
            out.append(f"a shorter context: {ctx_flag} {length} puts all {s.layers + 1} layers on the GPU")
            break
        length -= 1024
    if p.kv_dtype in ("auto", "", "f16"):
        q = variant(p, kv_dtype="q8_0")
        if q.fits:
            kv_flag = units.flags.get("kv_cache_dtype", "kv_cache_dtype")
            out.append(f"a q8_0 KV cache ({kv_flag} q8_0, with flash attention) puts all layers on the GPU")
    order = ["q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "q3_k_m", "q2_k"]
    if s.quant in order:
        for smaller in order[order.index(s.quant) + 1 :]:
            q = variant(p, shape=dataclasses.replace(s, quant=smaller))
            if q.fits:
                out.append(
                    f"a smaller file: {smaller.upper()} ({weight_bytes(q.shape) / GIB:.1f} GiB) fits whole"
                )
                break
    if 0 < p.gpu_layers <= s.layers:
        flag = units.flags.get("gpu_layers", "gpu_layers")
        whole = "" if out else "; no context or quantisation puts them all on these GPUs"
        out.append(
            f"running as is, slower: {flag} {p.gpu_layers} ({p.gpu_layers} of {s.layers + 1} layers on the "
            f"GPU, the rest on the CPU){whole}"
        )
    return out


# GPUs without FP8 (before Ampere: no FP8 kernels in the engines, not even weight-only Marlin)
NO_FP8 = re.compile(
    r"(?i)\b(?:T4|V100|P100|P40|P4|K80|M60|TITAN (?:RTX|V|Xp?)|Quadro RTX|RTX 20\d0|GTX)\b|RTX (?:4000|5000|6000|8000)(?! Ada)"
)


def fp8_supported(gpu_name: str | None) -> bool | None:
    """False for GPUs known to lack FP8 support (Turing, Volta, Pascal…), None when unknown."""
    if not gpu_name:
        return None
    return NO_FP8.search(gpu_name) is None
