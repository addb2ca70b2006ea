"""KV-cache bytes per token (per GPU under TP, sliding windows kept short) and for a batch."""

from __future__ import annotations

import dataclasses

from .shape import ModelShape
from .units import DTYPE_BYTES


def kv_bytes_per_token(s: ModelShape, kv_dtype: str = "auto", tp: int = 1) -> float:
    """KV bytes one token costs: per GPU at this tensor-parallel size (tp=1: the whole model)."""
    b = s.dtype_bytes if kv_dtype in ("auto", "", None) else DTYPE_BYTES.get(kv_dtype.split("_")[0], 1)
    if s.mla:
        return s.attn_layers * (s.mla[0] + s.mla[1]) * b  # one latent per layer, replicated on every rank
    kv_per_gpu = max(1, s.kv_heads // tp) if tp > 1 else s.kv_heads
    if s.global_kv:
        gh, gd = s.global_kv
        full = s.attn_layers - s.window_layers
        g_per_gpu = max(1, gh // tp) if tp > 1 else gh
        return 2 * (full * g_per_gpu * gd + s.window_layers * kv_per_gpu * s.head_dim) * b
    return 2 * s.attn_layers * kv_per_gpu * s.head_dim * b


def kv_bytes_for(s: ModelShape, tokens_per_seq: int, seqs: int, kv_dtype: str = "auto") -> float:
    """Bytes a cache of `seqs` sequences of `tokens_per_seq` tokens allocates when sliding-window
    layers keep only their window (llama.cpp, Ollama: a window plus one batch per sequence)."""
    per_token = kv_bytes_per_token(s, kv_dtype, 1)
    if not s.window_layers or not s.window or s.mla:
        return per_token * tokens_per_seq * seqs
    one = dataclasses.replace(s, attn_layers=s.window_layers, window_layers=s.window_layers, global_kv=None)
    window_part = kv_bytes_per_token(one, kv_dtype, 1)
    kept = min(tokens_per_seq, s.window + 512)
    return ((per_token - window_part) * tokens_per_seq + window_part * kept) * seqs
