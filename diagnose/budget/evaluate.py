"""A `Plan` evaluated: weights, activation, overhead and KV per GPU in the engine's own way (a
share of the GPU, or layers offloaded for llama.cpp and Ollama), and what it says when it
does not fit.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .activation import activation_gib, overhead_gib
from .kv import kv_bytes_for, kv_bytes_per_token
from .plan import Plan
from .units import GIB, QUANT_BYTES
from .weights import expert_padding_bytes, stage_layers, stage_weight_bytes, weight_bytes


def _outside_share(p: Plan, kind: str) -> tuple[float, float] | None:
    """Engines whose KV share leaves the rest for activations: (the GiB left beside it, what
    else must fit there besides the activations); None for the others."""
    if kind == "free_static":  # SGLang: (1 − mem_fraction_static) of the free memory
        return (1 - p.util) * (p.gpu_total_gib - p.used_gib), p.overhead_gib
    if kind == "free_after_weights" and p.units.activations == "in_rest":  # of what the weights left
        return (1 - p.util) * (p.gpu_total_gib - p.used_gib - p.weights_gib_per_gpu - p.overhead_gib), 0.0
    return None


def variant(p: Plan, **inputs: Any) -> Plan:
    """The same scenario with some inputs changed, evaluated afresh."""
    return evaluate(dataclasses.replace(p, **inputs))


def evaluate(p: Plan) -> Plan:
    """Fill the computed fields of a plan from its inputs."""
    if p.units.kv_budget == "layers":
        return _evaluate_layers(p)
    s, tp, pp, kind = p.shape, p.tp, p.pp, p.units.kv_budget
    p.reasons, p.assumptions, p.what_would, p.proposals = [], [], [], []
    stages = stage_weight_bytes(s, pp)
    padding = expert_padding_bytes(s, tp) * max(stage_layers(s.layers, pp)) / max(1, s.layers)
    p.weights_gib_per_gpu = (max(stages) + padding) / tp / GIB  # the heaviest stage must fit
    p.activation_gib = activation_gib(
        s, p.max_num_batched_tokens, p.max_num_seqs, tp, p.units, p.engine_version
    )
    p.overhead_gib = overhead_gib(p.units, p.engine_version, tp * pp, p.max_num_seqs, p.eager)
    p.assumptions.append(_budget_said(p))
    p.kv_gib_per_gpu = _kv_room(p, p.weights_gib_per_gpu)
    # what the weights may take before nothing is left for the KV cache
    if kind == "free_after_weights":
        before = p.activation_gib if p.units.activations == "before_share" else 0.0
        p.weights_room_gib = p.gpu_total_gib - p.used_gib - p.overhead_gib - before
    else:
        p.weights_room_gib = p.kv_gib_per_gpu + p.weights_gib_per_gpu
    # each stage caches its own layers: the one with the least room per token decides
    per_layer = kv_bytes_per_token(s, p.kv_dtype, tp) / max(1, s.layers)
    p.kv_tokens = (
        max(
            0,
            min(
                int(_kv_room(p, (w + padding / max(1, pp)) / tp / GIB) * GIB / (per_layer * max(1, n)))
                for w, n in zip(stages, stage_layers(s.layers, pp), strict=True)
            ),
        )
        if per_layer
        else 0
    )
    length = p.max_model_len
    window = s.window or length
    full = s.attn_layers - s.window_layers
    per_request = (full * length + s.window_layers * min(window, length)) / max(1, s.attn_layers)
    p.max_concurrency = p.kv_tokens / per_request if per_request else 0.0
    p.longest_context_for_seqs = int(p.kv_tokens / max(1, p.max_num_seqs))
    p.assumptions += _shape_said(p, padding)
    p.reasons += _why_not(p)
    p.fits = not p.reasons
    return p


def _kv_room(p: Plan, stage_weights_gib: float) -> float:
    """GiB of KV cache on a GPU holding these weights, by how the engine sizes its cache."""
    total, used, util, kind = p.gpu_total_gib, p.used_gib, p.util, p.units.kv_budget
    if kind == "free_static":
        return (total - used) * util - stage_weights_gib
    if kind == "free_after_weights":
        after = total - used - stage_weights_gib - p.overhead_gib
        if p.units.activations == "before_share":  # activation buffers are taken before the share
            return util * (after - p.activation_gib)
        return util * after  # LMDeploy: activations live in the rest
    return total * util - used - p.activation_gib - p.overhead_gib - stage_weights_gib


def _budget_said(p: Plan) -> str:
    """How this engine's KV budget is reckoned, in its own flag's words."""
    # SGLang: activations, CUDA graphs and the CUDA context live in the share outside the static
    # fraction (not subtracted from the pool, but they must fit there)
    share = f"{p.units.flags.get('gpu_memory_utilization', 'gpu_memory_utilization')} {p.util}"
    kind, engine = p.units.kv_budget, p.engine
    if kind == "free_static":
        return (
            f"{engine}: weights + KV pool = {share} × free memory; activations and CUDA graphs use the rest"
        )
    if kind == "free_after_weights":
        rest = (
            " and activation buffers"
            if p.units.activations == "before_share"
            else "; activations use the rest"
        )
        return f"{engine}: KV cache = {share} × the memory free after the weights" + rest
    return (
        f"{engine}: KV = total × {p.util} − weights − activation peak − non-torch/graphs; memory "
        "used by other processes is subtracted"
    )


def _shape_said(p: Plan, padding: float) -> list[str]:
    """What the plan assumed of the model: its weights, the activation peak, KV per token."""
    s, tp = p.shape, p.tp
    per_tok = kv_bytes_per_token(s, p.kv_dtype, tp) / p.pp
    return [
        (
            f"weights: {s.exact_bytes / GIB:.2f} GiB from {s.exact_from}, exactly"
            if s.exact_bytes
            else f"weights: {s.params_total / 1e9:.2f} B parameters, "
            + (f"{s.quant} linear layers" if s.quant else f"{s.dtype_bytes:g} bytes each")
            + (
                f" (int4 group size {s.int4_layout[0]}"
                + (", scales and zeros)" if s.int4_layout[1] else ", scales, no zeros)")
                if s.quant in ("int4", "awq", "gptq")
                else ""
            )
            + " (config arithmetic: give --weights DIR for the checkpoint's own size)"
        ),
        f"activation peak estimated for max_num_batched_tokens={p.max_num_batched_tokens}, max_num_seqs={p.max_num_seqs}",
        *([f"MXFP4 experts padded by the kernels: +{padding / tp / GIB:.2f} GiB per GPU"] if padding else []),
        f"KV per token per GPU {per_tok / 1024:.1f} KiB ({'MLA latent, replicated' if s.mla else 'KV heads split over TP'})",
    ]


def _why_not(p: Plan) -> list[str]:
    """Why the plan cannot work (none: it fits)."""
    s, tp, pp, kind, length = p.shape, p.tp, p.pp, p.units.kv_budget, p.max_model_len
    out = []
    if s.heads % tp:
        out.append(f"{s.heads} attention heads are not divisible by tensor_parallel_size {tp}")
    if pp > s.layers:
        out.append(f"{pp} pipeline stages for {s.layers} layers: a stage would hold none")
    if tp * pp > p.gpus:
        out.append(f"{tp * pp} GPUs needed (tp × pp), {p.gpus} visible")
    if p.kv_gib_per_gpu < 0:
        budget = p.weights_room_gib
        held = f" ({p.used_gib:.1f} GiB already in use there)" if p.used_gib * 1024 > 1024 else ""
        out.append(
            (
                f"weights need {p.weights_gib_per_gpu:.1f} GiB per GPU, the budget is {budget:.1f} GiB"
                if kind != "free_after_weights"
                else f"weights need {p.weights_gib_per_gpu:.1f} GiB per GPU, {budget:.1f} GiB are free"
            )
            + held
        )
    elif (rest := _outside_share(p, kind)) is not None and p.activation_gib + rest[1] > rest[0]:
        need, left = p.activation_gib + rest[1], rest[0]
        out.append(
            f"activations need {need:.1f} GiB, the {1 - p.util:.2f} left beside the KV cache is {left:.1f} GiB"
        )
    elif p.max_concurrency < 1:
        # sliding-window layers keep only their window: a request costs fewer tokens than its length
        out.append(f"the KV cache holds {p.kv_tokens} tokens, less than one request of {length}")
    if s.max_position and length > s.max_position:
        out.append(f"max_model_len {length} is above the model's max_position_embeddings {s.max_position}")
    return out


def _evaluate_layers(p: Plan) -> Plan:
    """Ollama and llama.cpp: how many layers (of the repeating ones plus the output layer) fit on
    the GPUs beside their share of the context's KV cache and the compute graph. The token
    embeddings stay on the CPU; a layer that does not fit runs on the CPU (slower, not a failure)."""
    s, units = p.shape, p.units
    p.reasons, p.assumptions, p.what_would, p.proposals = [], [], [], []
    bpw = QUANT_BYTES.get(s.quant or "", s.dtype_bytes)
    embed = s.vocab * s.hidden * bpw
    output = s.vocab * s.hidden * bpw
    repeating = max(0.0, weight_bytes(s) - embed - (0 if s.tied else output)) / max(1, s.layers)
    layer_bytes = [repeating] * s.layers
    if s.gguf and s.gguf.get("layer_bytes") and len(s.gguf["layer_bytes"]) == s.layers:
        # the file says what each layer weighs; llama.cpp offloads the last ones first
        layer_bytes = [float(x) for x in s.gguf["layer_bytes"]][::-1]
        embed, output = float(s.gguf["embed_bytes"]), float(s.gguf["output_bytes"])
        repeating = sum(layer_bytes) / max(1, s.layers)
    seqs = p.max_num_seqs
    tokens = p.max_model_len * (seqs if units.context == "per_sequence" else 1)
    per_seq = p.max_model_len if units.context == "per_sequence" else max(1, p.max_model_len // max(1, seqs))
    kv_layer = kv_bytes_for(s, per_seq, seqs, p.kv_dtype) / max(1, s.layers)
    graph = p.max_num_batched_tokens * (s.vocab + 4 * s.hidden) * 4 + (
        p.max_num_batched_tokens * min(p.max_model_len, 8192) * s.heads * 2
    )
    room = max(0.0, p.gpus * (p.gpu_total_gib - p.used_gib - units.reserve_gib) * GIB - graph)
    n, used = 0, 0.0
    for b in layer_bytes:  # the heaviest-first order does not matter: llama.cpp's own order
        if used + b + kv_layer > room:
            break
        used += b + kv_layer
        n += 1
    p.gpu_layers = n + (1 if n == s.layers and room - used >= output else 0)
    on_gpu = sum(layer_bytes[:n]) + (output if p.gpu_layers > s.layers else 0)
    p.weights_gib_per_gpu = on_gpu / max(1, p.gpus) / GIB
    p.kv_gib_per_gpu = n * kv_layer / max(1, p.gpus) / GIB
    p.activation_gib = graph / GIB
    p.overhead_gib = units.reserve_gib
    p.kv_tokens = tokens
    p.max_concurrency = float(p.max_num_seqs if units.context == "per_sequence" else 1)
    p.longest_context_for_seqs = p.max_model_len
    ctx_flag = units.flags.get("max_model_len", "max_model_len")
    layers_flag = units.flags.get("gpu_layers", "gpu_layers")
    p.assumptions += [
        f"{p.engine}: layers on the GPU ({layers_flag}) each with its share of the KV cache for "
        f"{tokens:,} tokens ({ctx_flag} {p.max_model_len}"
        + (f" × {p.max_num_seqs} parallel" if units.context == "per_sequence" and p.max_num_seqs > 1 else "")
        + "); token embeddings on the CPU",
        f"weights: {weight_bytes(s) / GIB:.2f} GiB as {s.quant}, {repeating / GIB:.3f} GiB a layer"
        + (f" ({s.exact_from})" if s.exact_from else ""),
        f"compute graph {graph / GIB:.2f} GiB for a {p.max_num_batched_tokens}-token batch; "
        f"{units.reserve_gib} GiB a GPU kept free (CUDA context, the engine's minimum)",
    ]
    if s.max_position and p.max_model_len > s.max_position:
        p.reasons.append(
            f"{ctx_flag} {p.max_model_len} is above the model's max_position_embeddings {s.max_position}"
        )
    if p.gpu_layers <= s.layers:
        p.reasons.append(
            f"{p.gpu_layers} of {s.layers + 1} layers fit on the GPU with {p.max_model_len:,} tokens of "
            "context: the rest run on the CPU (it works, much slower)"
        )
    p.fits = not p.reasons
    return p
