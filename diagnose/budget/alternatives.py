"""What would fit instead, when a launch does not: every candidate judged by the same budget that
judged the launch, on the GPUs given, the smallest change first — another parallel size, a
shorter context, a smaller KV share, an fp8 KV cache, the busy GPUs freed, quantised weights;
more GPUs only when nothing on these keeps the context asked.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from ..host.gpu_pool import GpuPool
from .evaluate import variant
from .plan import Plan
from .units import GIB
from .weights import weight_bytes


@dataclass(slots=True)
class Proposal:
    kind: str  # parallel / context / share / kv_dtype / free_gpus / quantization / more_gpus / layers
    text: str  # in the engine's own flags
    plan: Plan  # the candidate, evaluated: it fits (or, for layers, runs)
    changes: dict[str, Any] = field(default_factory=dict)  # canonical parameter → value

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "changes": dict(self.changes), "fits": self.plan.fits}


def at_size(p: Plan, tp: int, pool: GpuPool, engine_order: bool = False, **inputs: Any) -> Plan:
    """The plan at this tensor-parallel size, placed on the pool: the first tp × pp GPUs visible
    when `engine_order` (a launch as typed), else the freest; each GPU's budget is the smallest
    and busiest of those it runs on."""
    n = tp * p.pp
    where = pool.placed(n, engine_order) or pool.placed(min(n, pool.count), True)
    assert where is not None  # a pool holds at least one GPU
    return variant(
        p,
        tp=tp,
        gpus=pool.count if engine_order else len(pool.healthy),
        gpu_total_gib=where.total_gib,
        used_gib=where.used_gib,
        gpu_name=where.name or p.gpu_name,
        devices=where.indices,
        launch_env=pool.visible_prefix(where) if n <= pool.count else "",
        **inputs,
    )


def valid_sizes(p: Plan, pool: GpuPool) -> list[int]:
    """Tensor-parallel sizes that divide the attention heads, on the GPUs that can take a launch."""
    cap = max(1, len(pool.healthy) // max(1, p.pp))
    return [t for t in range(1, cap + 1) if p.shape.heads % t == 0]


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


def fitting_share(p: Plan) -> float | None:
    """When the activations do not fit beside the engine's KV share: the largest share, in 0.05
    steps, with which the plan fits; None otherwise."""
    if not any(r.startswith("activations need") for r in p.reasons):
        return None
    for step in range(int(p.util * 20) - 1, 5, -1):
        if variant(p, util=step / 20).fits:
            return step / 20
    return None


def alternatives(p: Plan, pool: GpuPool, asked_tp: int | None = None) -> list[Proposal]:
    """The launches that would fit where `p` does not, smallest change first. `asked_tp`: the
    parallel size the user chose (the nearest that fits is proposed), None when the search
    already tried every size (only what else would fit is proposed)."""
    if p.units.kv_budget == "layers":
        return _layers(p)
    sizes = valid_sizes(p, pool)
    out: list[Proposal] = []
    # the size the other changes are made at: the one asked when it can run, else the nearest
    base = p
    if asked_tp is not None:
        nearest = sorted(sizes, key=lambda d: (abs(d - asked_tp), -d))
        tp_flag = p.units.flags.get("tensor_parallel_size", "tp")
        for t in nearest:
            q = at_size(p, t, pool)
            if q.fits:
                out.append(_parallel(q, t, pool, tp_flag, asked_tp))
                break
        if p.tp not in sizes:
            if out or not nearest:  # the size asked cannot run: the one that fits is the change
                return out
            base = at_size(p, nearest[0], pool)
    keeps_context = bool(out)
    out += _same_size(base, pool, sizes)
    keeps_context = keeps_context or any(pr.kind in ("share", "kv_dtype") for pr in out)
    freed = _free_busy(base, pool)  # not the launch's own change: quantised weights still count
    shortest = max((pr.changes["max_model_len"] for pr in out if pr.kind == "context"), default=0)
    ctx_flag = p.units.flags.get("max_model_len", "--max-model-len")
    for pr in _quantised(base, pool, sizes, ctx_flag, fp8_supported(base.gpu_name)):
        kept = "max_model_len" not in pr.changes
        # a bigger change than those above: when it keeps the context, or more of it than they do
        if kept or (not keeps_context and pr.changes["max_model_len"] > shortest):
            out.append(pr)
            keeps_context = keeps_context or kept
    if freed:
        out.insert(next((i for i, pr in enumerate(out) if pr.kind == "quantization"), len(out)), freed)
        keeps_context = True
    if not keeps_context:
        out += _more_gpus(base, pool, ctx_flag)
    return out


def _same_size(base: Plan, pool: GpuPool, sizes: list[int]) -> list[Proposal]:
    """A shorter context (at this size, else the largest that holds one), a smaller KV share,
    an fp8 KV cache: the launch's own GPUs and weights."""
    flags, out = base.units.flags, []
    ctx_flag = flags.get("max_model_len", "--max-model-len")
    q, shorter = longest_context(base)
    if not shorter and base.kv_gib_per_gpu < 0:  # no context fits at this size: the largest that holds one
        for t in sorted(sizes, reverse=True):
            q, shorter = longest_context(at_size(base, t, pool))
            if shorter:
                break
    if shorter:
        out.append(
            Proposal(
                "context",
                f"a shorter context: {ctx_flag} {shorter} at tp={q.tp}" + _on(q, pool),
                q,
                _with_place(q, pool, {"tensor_parallel_size": q.tp, "max_model_len": shorter}),
            )
        )
    share = fitting_share(base)
    if share:
        util_flag = flags.get("gpu_memory_utilization", "gpu_memory_utilization")
        q = variant(base, util=share)
        changes = {"tensor_parallel_size": q.tp, "gpu_memory_utilization": f"{share:.2f}"}
        out.append(
            Proposal(
                "share",
                f"a smaller KV share: {util_flag} {share:.2f} leaves the activations room",
                q,
                _with_place(q, pool, changes),
            )
        )
    kv_flag = flags.get("kv_cache_dtype")
    fp8 = fp8_supported(base.gpu_name)
    if base.kv_dtype in ("auto", "") and not base.shape.mla and fp8 is not False and kv_flag:
        q = variant(base, kv_dtype="fp8")
        if q.fits:
            out.append(
                Proposal(
                    "kv_dtype",
                    f"an fp8 KV cache ({kv_flag} fp8) at tp={q.tp}: {q.kv_tokens:,} tokens" + _on(q, pool),
                    q,
                    _with_place(q, pool, {"tensor_parallel_size": q.tp, "kv_cache_dtype": "fp8"}),
                )
            )
    return out


def _parallel(q: Plan, t: int, pool: GpuPool, tp_flag: str, asked: int) -> Proposal:
    devices = ",".join(map(str, q.devices or ()))
    busy = [g.index for g in pool.busy if g.index not in (q.devices or ())]
    busy_s = f"GPU{'s' if len(busy) > 1 else ''} {','.join(map(str, busy))}"
    left_out = f" (not the busy {busy_s})" if q.launch_env and busy else ""
    if t == asked:  # the same size, on other GPUs
        return Proposal(
            "placement",
            f"CUDA_VISIBLE_DEVICES={devices}: the same size on GPU{'s' if len(q.devices or ()) > 1 else ''} "
            f"{devices}{left_out}: {q.kv_tokens:,} KV tokens",
            q,
            _with_place(q, pool, {}),
        )
    n = t * q.pp
    where = (
        f"on {_gpus_named(q.devices)}{left_out}"
        if q.launch_env
        else f"on the {n} GPUs given"
        if n == pool.count
        else f"on {n} of the {pool.count} GPUs given"
    )
    return Proposal(
        "parallel",
        f"{tp_flag} {t} {where}: {q.kv_tokens:,} KV tokens",
        q,
        _with_place(q, pool, {"tensor_parallel_size": t}),
    )


def _on(q: Plan, pool: GpuPool) -> str:
    """Where the candidate runs, when that is not where the engine would put it by itself."""
    return f" on {_gpus_named(q.devices)}" if q.launch_env else ""


def _gpus_named(devices: tuple[int, ...] | None) -> str:
    """ "GPU 1" or "GPUs 1,2" (nvidia-smi's indices)."""
    devices = devices or ()
    return f"GPU{'s' if len(devices) > 1 else ''} {','.join(map(str, devices))}"


def _with_place(q: Plan, pool: GpuPool, changes: dict[str, Any]) -> dict[str, Any]:
    """The changes, and the variables of the candidate's placement when the engine would not
    take those GPUs by itself."""
    if q.launch_env and q.devices:
        changes.update({f"env:{k}": v for k, v in pool.placement_env(q.devices).items()})
    return changes


def _free_busy(p: Plan, pool: GpuPool) -> Proposal | None:
    """The launch on the GPUs others hold memory on, were that memory freed."""
    busy = [g for g in pool.busy if g.index in (p.devices or ())]
    if not busy or p.used_gib <= 0:
        return None
    q = variant(
        p,
        used_gib=max(
            (g.used_gib for g in pool.gpus if g.index in (p.devices or ()) and not g.busy), default=0.0
        ),
    )
    if not q.fits:
        return None
    held = ", ".join(f"GPU {g.index}'s {g.used_gib:.1f} GiB" for g in busy)
    return Proposal(
        "free_gpus",
        f"free {held} (see `nvidia-smi`): then tp={q.tp} fits with {q.kv_tokens:,} KV tokens",
        q,
        {"action:free_gpu": f"stop what holds {held} (see `nvidia-smi`)"},
    )


def _quantised(p: Plan, pool: GpuPool, sizes: list[int], ctx_flag: str, fp8: bool | None) -> list[Proposal]:
    """fp8, then int4 weights, at the smallest parallel size where they fit on the GPUs given."""
    s = p.shape
    if s.quant is not None:
        return []
    out: list[Proposal] = []
    for method in ("fp8", "int4") if fp8 is not False else ("int4",):
        found: tuple[Plan, int | None, int] | None = None
        for t in sizes:  # the smallest size that keeps the context, else the longest context
            flag_value = "awq" if method == "int4" else method  # int4: an AWQ (or GPTQ) checkpoint
            q, shorter = longest_context(
                at_size(p, t, pool, shape=dataclasses.replace(s, quant=method), quantization=flag_value)
            )
            if q.fits and (found is None or (shorter or q.max_model_len) > found[0].max_model_len):
                found = (q, shorter, t)
            if q.fits and not shorter:
                break
        if found is None:
            continue
        q, shorter, t = found
        changes = _with_place(q, pool, {"tensor_parallel_size": t, "quantization": q.quantization})
        if shorter:
            changes["max_model_len"] = shorter
        out.append(
            Proposal(
                "quantization",
                (f"{method} weights" if method == "fp8" else "int4 weights (an AWQ or GPTQ checkpoint)")
                + f" ({q.weights_gib_per_gpu:.1f} GiB per GPU) at tp={q.tp}"
                + (f" with {ctx_flag} {shorter}" if shorter else "")
                + _on(q, pool),
                q,
                changes,
            )
        )
        if not shorter:
            break
    return out


def _more_gpus(p: Plan, pool: GpuPool, ctx_flag: str) -> list[Proposal]:
    """The fewest GPUs like the smallest given that run it (with a shorter context), and the
    fewest on which the context asked fits."""
    s, out = p.shape, []
    start = len(pool.healthy) // max(1, p.pp) + 1
    for t in [t for t in range(start, 65) if s.heads % t == 0 and t & (t - 1) == 0]:
        q, shorter = longest_context(
            variant(p, tp=t, gpus=t * p.pp, used_gib=0.0, launch_env="", devices=None)
        )
        if not q.fits or (shorter and out):
            continue
        changes: dict[str, Any] = {"tensor_parallel_size": t}
        if shorter:
            changes["max_model_len"] = shorter
        out.append(
            Proposal(
                "more_gpus",
                f"more GPUs: tp={t} on {t * p.pp} GPUs of {round(p.gpu_total_gib, 1):g} GiB"
                + (f" with {ctx_flag} {shorter}" if shorter else ""),
                q,
                changes,
            )
        )
        if not shorter:
            break
    return out


def _layers(p: Plan) -> list[Proposal]:
    """Layer-offload engines: a shorter context, a q8_0 KV cache or a smaller file puts every
    layer on the GPU; else the layers that fit, running the rest on the CPU."""
    s, units = p.shape, p.units
    out: list[Proposal] = []
    ctx_flag = units.flags.get("max_model_len", "max_model_len")
    length = p.max_model_len // 1024 * 1024
    while length >= 1024:
        q = variant(p, max_model_len=length)
        if q.fits:
            out.append(
                Proposal(
                    "context",
                    f"a shorter context: {ctx_flag} {length} puts all {s.layers + 1} layers on the GPU",
                    q,
                    {"max_model_len": length},
                )
            )
            break
        length -= 1024
    if p.kv_dtype in ("auto", "", "f16"):
        q = variant(p, kv_dtype="q8_0")
        if q.fits:
            kv_flag = units.flags.get("kv_cache_dtype", "kv_cache_dtype")
            out.append(
                Proposal(
                    "kv_dtype",
                    f"a q8_0 KV cache ({kv_flag} q8_0, with flash attention) puts all layers on the GPU",
                    q,
                    {"kv_cache_dtype": "q8_0"},
                )
            )
    order = ["q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "q3_k_m", "q2_k"]
    if s.quant in order:
        for smaller in order[order.index(s.quant) + 1 :]:
            q = variant(p, shape=dataclasses.replace(s, quant=smaller))
            if q.fits:
                out.append(
                    Proposal(
                        "quantization",
                        f"a smaller file: {smaller.upper()} ({weight_bytes(q.shape) / GIB:.1f} GiB) fits whole",
                        q,
                        {"quantization": smaller},
                    )
                )
                break
    if 0 < p.gpu_layers <= s.layers:
        flag = units.flags.get("gpu_layers", "gpu_layers")
        whole = "" if out else "; no context or quantisation puts them all on these GPUs"
        out.append(
            Proposal(
                "layers",
                f"running as is, slower: {flag} {p.gpu_layers} ({p.gpu_layers} of {s.layers + 1} layers on the "
                f"GPU, the rest on the CPU){whole}",
                p,
                {"gpu_layers": p.gpu_layers},
            )
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
