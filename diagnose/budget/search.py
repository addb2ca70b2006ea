"""The search: `plan` tries the parallel sizes that divide the heads on the GPUs given (each
placed on the GPUs that can take it), then what would fit instead (`alternatives`) is worked
out by the same evaluation that judged the launch.
"""

from __future__ import annotations

import dataclasses

from ..base.errors import InputError
from ..host.gpu_pool import GpuPool, uniform_pool
from .activation import engine_defaults, profiled_tokens
from .alternatives import Proposal, alternatives, at_size, fp8_supported, longest_context, valid_sizes
from .evaluate import evaluate, variant
from .plan import Plan
from .shape import ModelShape
from .units import GGUF_DEFAULT, GGUF_TYPES, QUANT_BYTES, EngineUnits, engine_units


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
    pool: GpuPool | None = None,
    engine_order: bool = False,
    model_id: str | None = None,
    quantization: str | None = None,
) -> Plan:
    """The plan for this model on these GPUs (`pool`, else `gpus` alike of `gpu_total_gib`
    with `used_gib` held on each): at `tp`, placed as the engine places it when
    `engine_order`, else on the freest GPUs; without `tp`, the smallest size that fits. When
    nothing fits, its `proposals`: what would, the smallest change first."""
    units = units or engine_units(engine)
    pool = pool or uniform_pool(gpus, gpu_total_gib, "", used=used_gib)
    gpus, gpu_total_gib, gpu_name = pool.count, min(g.usable_gib for g in pool.gpus), gpu_name or pool.name
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
        model_id=model_id,
        quantization=quantization,
    )
    if units.kv_budget == "layers":
        return _on_every_gpu(base, pool, tp, gguf_note)
    candidates = [tp] if tp else valid_sizes(base, pool)
    chosen = base
    for t in candidates:
        chosen = at_size(base, t, pool, engine_order)
        if chosen.fits:
            break
    if not chosen.fits:
        _propose(chosen, pool, tp)
    chosen.assumptions.insert(0, batched_why)
    if not max_num_seqs:
        chosen.assumptions.insert(1, f"max_num_seqs={seqs}: the engine's default")
    return chosen


def _on_every_gpu(base: Plan, pool: GpuPool, tp: int | None, gguf_note: str | None) -> Plan:
    """Layer-offload engines spread the layers over every GPU by its free memory: the sum counts."""
    base.tp = tp or 1
    n = pool.count
    chosen = evaluate(
        dataclasses.replace(
            base,
            gpu_total_gib=sum(g.usable_gib for g in pool.gpus) / n,
            used_gib=sum(g.used_gib for g in pool.gpus) / n,
            devices=tuple(g.index for g in pool.gpus),
        )
    )
    if not chosen.fits:
        _propose(chosen, pool, tp)
    if gguf_note:
        chosen.assumptions.insert(0, gguf_note)
    return chosen


def _propose(p: Plan, pool: GpuPool, asked_tp: int | None) -> None:
    p.proposals = alternatives(p, pool, asked_tp)
    p.what_would = [pr.text for pr in p.proposals]


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


def with_auto_context(p: Plan, asked: int | None) -> tuple[Plan, int | None]:
    """The question `plan` answers when no context was asked: at what context does it fit? The
    plan at the longest one, as `--max-model-len auto` picks it, when the model's own length is
    all that does not fit; (that plan, the length), else (p, None)."""
    if asked is not None or p.fits or p.units.kv_budget == "layers":
        return p, None
    q, auto = longest_context(p)
    if not auto and p.proposals and p.proposals[0].kind == "context":  # at another size or placement
        q, auto = p.proposals[0].plan, p.proposals[0].changes["max_model_len"]
    if auto:
        q.assumptions.insert(
            0,
            f"max_model_len {auto}: the longest context that fits (as --max-model-len auto picks it); "
            f"the model's own {p.shape.max_position or p.max_model_len} does not",
        )
    return q, auto


def beyond_auto(q: Plan, pool: GpuPool) -> list[Proposal]:
    """What a launch gains over the context `--max-model-len auto` picks (`q`, at it): the longer
    context an fp8 KV cache holds, and the model's whole context at a larger parallel size on
    the GPUs given (else the longest there)."""
    flags, full = q.units.flags, q.shape.max_position or q.max_model_len
    ctx_flag, kv_flag = flags.get("max_model_len", "--max-model-len"), flags.get("kv_cache_dtype")
    out: list[Proposal] = []
    if q.kv_dtype in ("auto", "") and not q.shape.mla and fp8_supported(q.gpu_name) is not False and kv_flag:
        r = variant(q, kv_dtype="fp8", max_model_len=full)
        r, _ = longest_context(r)
        if r.fits and r.max_model_len > q.max_model_len:
            whole = " (the model's whole context)" if r.max_model_len == full else ""
            out.append(
                Proposal(
                    "kv_dtype",
                    f"{kv_flag} fp8 holds {ctx_flag} {r.max_model_len}{whole}",
                    r,
                    {"kv_cache_dtype": "fp8", "max_model_len": r.max_model_len},
                )
            )
    for t in (t for t in valid_sizes(q, pool) if t > q.tp):
        r, _ = longest_context(at_size(q, t, pool, max_model_len=full))
        if r.fits and r.max_model_len > q.max_model_len:
            tp_flag = flags.get("tensor_parallel_size", "tp")
            whole = " (the model's whole context)" if r.max_model_len == full else ""
            out.append(
                Proposal(
                    "parallel",
                    f"{tp_flag} {t} holds {ctx_flag} {r.max_model_len}{whole}",
                    r,
                    {"tensor_parallel_size": t, "max_model_len": r.max_model_len},
                )
            )
            break
    return out
