"""Bytes per weight and per KV element (dtypes, quantisations, GGUF types) and each engine's own
units of memory (`EngineUnits`, from its profile's `memory`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..base.errors import InputError

GIB = 1 << 30
INT4_GROUP = 128  # GPTQ/AWQ group size assumed for scales and zeros
DTYPE_BYTES = {
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "fp8": 1,
    "float8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}
QUANT_BYTES = {
    "fp8": 1.0,
    "int8": 1.0,
    "w8a8": 1.0,
    "fp4": 0.5625,
    "nvfp4": 0.5625,
    "mxfp4": 0.53125,
    "int4": 0.5 + (2 + 0.5) / INT4_GROUP,
    "awq": 0.5 + (2 + 0.5) / INT4_GROUP,
    "gptq": 0.5 + (2 + 0.5) / INT4_GROUP,
    "fbgemm_fp8": 1.0,  # Meta's FP8 checkpoints: the MLPs only (see not_converted)
    "modelopt": 1.0,  # NVIDIA ModelOpt FP8 (quant_algo FP8)
}
# GGUF (Ollama, llama.cpp): bits per weight of the whole file, mixed tensor types included
GGUF_BYTES = {
    "iq2_m": 2.70 / 8,
    "iq3_s": 3.44 / 8,
    "iq3_m": 3.66 / 8,
    "iq4_xs": 4.25 / 8,
    "iq4_nl": 4.50 / 8,
    "q2_k": 3.35 / 8,
    "q3_k_m": 3.91 / 8,
    "q4_0": 4.55 / 8,
    "q4_k_m": 4.89 / 8,
    "q5_k_m": 5.70 / 8,
    "q6_k": 6.59 / 8,
    "q8_0": 8.50 / 8,
    "f16": 2.0,
}
QUANT_BYTES.update(GGUF_BYTES)
# what --kv-cache-dtype may name: vLLM's and SGLang's (auto, fp8 kinds), LMDeploy's int8/int4,
# llama.cpp's and Ollama's cache types
KV_CACHE_DTYPES = (
    "auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "bf16", "fp16", "f16", "f32",
    "q8_0", "q5_0", "q5_1", "q4_0", "q4_1", "iq4_nl",
)  # fmt: skip
GGUF_TYPES = frozenset(GGUF_BYTES)
GGUF_DEFAULT = "q4_k_m"  # what Ollama's library tags and most published GGUF files carry


@dataclass
class EngineUnits:
    """How an engine sizes its memory and spells its launch: its profile's `memory` section
    (kv_budget, launch, context), flags and defaults (engines.KV_BUDGETS says what each means)."""

    engine: str
    kv_budget: str = "total"
    launch: str | None = None
    flags: dict[str, str] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    context: str = "per_sequence"  # llama.cpp: one context shared by its slots ("shared")
    reserve_gib: float = 0.5  # layer-offload engines: memory a GPU keeps beyond the layers
    # "vllm": vLLM's version-dependent arithmetic (V0/V1 defaults, sampler, non-torch memory and
    # CUDA graphs by release); None: the seed guide's CUDA context + allocator slack
    model: str | None = None
    # "dummy_batch": the activation peak is a profiling pass over a dummy batch (and the vision
    # encoder), its size the engine's defaults by GPU; "own": the profile's own defaults
    profile: str = "own"
    # free_after_weights engines: "before_share" when activation buffers are taken before the
    # KV share (TRT-LLM, TGI), "in_rest" when they live in what the share leaves (LMDeploy)
    activations: str = "in_rest"


def engine_units(engine: str, profiles: Any = None) -> EngineUnits:
    """The engine's units from its profile (the shipped ones unless `profiles` is given)."""
    if profiles is None:
        from ..knowledge.engine_profiles import load_profiles

        profiles = load_profiles()
    prof = profiles.by_engine.get(engine)
    if prof is None:
        known = ", ".join(sorted(profiles.by_engine))
        raise InputError(f"--engine {engine}: no such engine (known: {known})")
    m = prof.memory
    return EngineUnits(
        engine=engine,
        kv_budget=m.get("kv_budget", "total"),
        launch=m.get("launch"),
        flags=dict(prof.flags),
        defaults={**profiles.get("generic").defaults, **prof.defaults},  # the generic profile's fill in
        context=m.get("context", "per_sequence"),
        reserve_gib=float(m.get("reserve_gib", 0.5)),
        model=m.get("model"),
        profile=m.get("profile", "own"),
        activations=m.get("activations", "in_rest"),
    )
