"""Weight bytes: whole, per pipeline stage, int4 groups, and the experts' padding under TP."""

from __future__ import annotations

from .shape import ModelShape
from .units import GGUF_TYPES, QUANT_BYTES


def int4_bytes(s: ModelShape) -> float:
    group, zeros = s.int4_layout
    return 0.5 + (2 + (0.5 if zeros else 0.0)) / group


def weight_bytes(s: ModelShape) -> float:
    """Bytes of all weights: the checkpoint's own size when known, else quantized linear
    layers plus the rest at the model dtype."""
    if s.exact_bytes:
        return float(s.exact_bytes)
    if s.quant == "mxfp4":  # gpt-oss: only the experts are MXFP4
        return s.expert_params * QUANT_BYTES["mxfp4"] + (s.params_total - s.expert_params) * s.dtype_bytes
    if s.quant in GGUF_TYPES:  # every tensor of a GGUF file is in its mix, embeddings too
        return s.params_total * QUANT_BYTES[s.quant]
    per = (
        int4_bytes(s) if s.quant in ("int4", "awq", "gptq") else QUANT_BYTES.get(s.quant or "", s.dtype_bytes)
    )
    return s.params_quantizable * per + s.params_kept * s.dtype_bytes


def stage_layers(layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage as vLLM splits them (`get_pp_indices`): an even share, the
    remainder given to the stages before the last (which holds lm_head)."""
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i if i <= pp else -1] += 1
    return parts


def stage_weight_bytes(s: ModelShape, pp: int) -> list[float]:
    """Weight bytes of each pipeline stage: its layers, the embeddings on the first, lm_head on
    the last (held there even when tied). pp=1 is weight_bytes."""
    total = weight_bytes(s)
    if pp <= 1:
        return [total]
    emb = s.vocab * s.hidden * s.dtype_bytes
    body = total - emb - (0 if s.tied else emb)
    per_layer = body / max(1, s.layers)
    out = [n * per_layer for n in stage_layers(s.layers, pp)]
    out[0] += emb
    out[-1] += emb
    return out


def expert_padding_bytes(s: ModelShape, tp: int) -> float:
    """Bytes vLLM's MXFP4 MoE kernels add to the experts of the whole model at this TP size: each
    expert's hidden size is padded to a multiple of 256 and its intermediate size per rank to a
    multiple of 64 (gpt-oss: 2880 → 3072; measured 13.72 GiB for a 12.8 GiB checkpoint)."""
    if s.quant != "mxfp4" or not s.moe_intermediate:
        return 0.0
    i = s.moe_intermediate / tp
    grown = (-(-s.hidden // 256) * 256) * (-(-int(i) // 64) * 64) / (s.hidden * i)
    return s.expert_params * QUANT_BYTES["mxfp4"] * (grown - 1)
