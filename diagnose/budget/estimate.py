"""Memory arithmetic from config.json: parameters, weights per GPU, KV cache per token, budget.

"Do the memory arithmetic before you type the launch command" (seed 000). Parameters are
counted from the architecture (embeddings, attention — MHA/GQA/MQA or DeepSeek's MLA —
dense MLPs and every MoE expert, shared experts, norms, vision towers), not guessed from the
name; bytes per parameter follow the quantization; the KV cache follows what vLLM and SGLang
allocate (engine-messages.md §6).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.errors import InputError

GIB = 1 << 30
# nvidia-smi's memory.total is more than the CUDA runtime (and so torch and the engines) sees:
# RTX 3090 24,576 MiB vs 23.69 GiB, T4 15,360 MiB vs 14.56 GiB, H100 81,559 MiB vs 79.18 GiB,
# H200 143,771 MiB vs 139.72 GiB, A100 80GB 81,920 MiB vs 79.25 GiB (real logs): 0.3-0.75 GiB.
CUDA_UNSEEN_GIB = 0.45
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
    "fbgemm_fp8": 1.0,  # Meta's FP8 checkpoints: the MLPs only (see _not_converted)
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


class ConfigError(InputError):
    pass


CONFIG_MAX_BYTES = 16 << 20  # the largest config.json a model ships is tens of KiB


def load_config(path: str) -> dict[str, Any]:
    p = Path(path)
    if p.suffix.lower() == ".gguf" and p.is_file():
        from .gguf import config_from_gguf

        return config_from_gguf(str(p))  # Ollama's and llama.cpp's own files
    if p.is_dir():
        p = p / "config.json"
    if p.exists() and not p.is_file():
        raise ConfigError(f"{p}: not a regular file (give config.json or the model directory)")
    try:
        with open(p, "rb") as f:
            raw = f.read(CONFIG_MAX_BYTES + 1)
        if len(raw) > CONFIG_MAX_BYTES:
            raise ConfigError(f"{p}: over {CONFIG_MAX_BYTES >> 20} MiB: not a model's config.json")
        data = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file (give config.json or the model directory)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: not JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested too deeply to be a model's config.json") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a config.json is a JSON object")
    data["__path__"] = str(p)
    _merge_hf_quant(data, p.parent / "hf_quant_config.json")
    return data


def _check_quantization(q: Any, path: str) -> None:
    """The quantisation block's numbers are numbers (`bits: "four"` is a broken file, not a
    4-bit model): GPTQ's `bits` and `group_size` (-1 for one group), AWQ's `w_bit` and
    `q_group_size`."""
    if q is None:
        return
    if not isinstance(q, dict):
        raise ConfigError(f"{path}: field 'quantization_config' is {q!r}: it must be a JSON object")
    for k, low, high in (
        ("bits", 1, 16),
        ("w_bit", 1, 16),
        ("group_size", -1, 1 << 20),
        ("q_group_size", -1, 1 << 20),
    ):
        v = q.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high or v == 0:
            raise ConfigError(
                f"{path}: field 'quantization_config.{k}' is {v!r}: it must be a whole number from {low} to {high}"
            )


def _merge_hf_quant(cfg: dict[str, Any], beside: Path) -> None:
    """NVIDIA ModelOpt checkpoints keep their quantisation in hf_quant_config.json beside
    config.json ({"quantization": {"quant_algo": "NVFP4", "exclude_modules": [...]}}): read it
    as the quantization_config when config.json has none."""
    if cfg.get("quantization_config") or not beside.is_file():
        return
    try:
        with open(beside, encoding="utf-8") as f:
            hf = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{beside}: cannot read: {e}") from None
    q = hf.get("quantization") if isinstance(hf, dict) else None
    if not isinstance(q, dict):
        raise ConfigError(f"{beside}: field 'quantization' missing: not a ModelOpt quant config")
    cfg["quantization_config"] = {"quant_method": "modelopt", **q}


@dataclass
class ModelShape:
    name: str
    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    max_position: int | None
    dtype_bytes: float
    quant: str | None  # method from quantization_config or --quantization
    mla: tuple[int, int] | None  # (kv_lora_rank, qk_rope_head_dim)
    attn_layers: int  # layers that keep a KV cache
    window_layers: int  # of which capped by a sliding window
    window: int | None
    params_quantizable: float  # linear layers (attention, MLP, experts)
    params_kept: float  # embeddings, lm_head, norms, routers, vision tower
    expert_params: float
    partial: list[str] = field(default_factory=list)
    exact_bytes: int | None = None  # the checkpoint's own size, when its files were read
    exact_from: str | None = None  # which file said it
    # activations per token of the widest MLP, in units of a dense MLP's intermediate width:
    # a dense model's intermediate size; an MoE's top-k experts (their fused gate-up, act and
    # down outputs) plus its shared experts
    mlp_width: int = 0
    moe_intermediate: int = 0  # one expert's intermediate size (0: no experts)
    int4_layout: tuple[int, bool] = (INT4_GROUP, True)  # (group size, zero points stored)
    # full-attention layers with their own KV shape (Gemma 4: global_head_dim 512 and
    # num_global_key_value_heads): (kv heads, head dim); None when they match the others
    global_kv: tuple[int, int] | None = None
    # vision tower: (ViT width, its MLP width, patches vLLM profiles the encoder with); 0 = none
    vision: tuple[int, int, int] = (0, 0, 0)
    # a GGUF file's own bytes: per layer, token embeddings, output layer (gguf.config_from_gguf)
    gguf: dict[str, Any] | None = None

    @property
    def params_total(self) -> float:
        return self.params_quantizable + self.params_kept


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def _layer_kinds(text: dict[str, Any], layers: int) -> tuple[list[bool | None], int | None]:
    """Per layer: True keeps a full KV cache, None a sliding-window one, False none (Mamba,
    linear attention); and the window."""
    window = text.get("sliding_window")
    types = text.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        kinds: list[bool | None] = []
        for t in types:
            if t in ("sliding_attention", "local"):
                kinds.append(None)
            else:
                kinds.append(t in ("full_attention", "attention", "global"))
        return kinds, int(window) if window and None in kinds else None
    pattern = text.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return [c == "*" for c in pattern], None
    every = text.get("sliding_window_pattern")
    if isinstance(every, int) and every > 1 and window:
        # Gemma 2 (2) and 3 (6): every n-th layer attends globally, the others in a window
        return [True if (i + 1) % every == 0 else None for i in range(layers)], int(window)
    return [True] * layers, None


# far above any model's: a config past them is broken (a loop over 10^12 layers would not end)
COUNT_LIMITS = {
    "num_hidden_layers": 100_000,
    "n_routed_experts": 1_000_000,
    "num_experts": 1_000_000,
    "num_local_experts": 1_000_000,
}
COUNT_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "moe_intermediate_size",
    "n_routed_experts",
    "num_experts",
    "num_local_experts",
    "kv_lora_rank",
    "max_position_embeddings",
)


# Names some families use for the usual fields (ChatGLM/GLM-4: num_layers, padded_vocab_size…).
_ALIASES = {
    "num_layers": "num_hidden_layers",
    "padded_vocab_size": "vocab_size",
    "ffn_hidden_size": "intermediate_size",
    "kv_channels": "head_dim",
    "seq_length": "max_position_embeddings",
}
# What a family's config class fills in when config.json leaves it out (transformers' own
# defaults): Gemma ties its embeddings and interleaves sliding-window layers.
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262208,
        "tie_word_embeddings": True,
        "max_position_embeddings": 131072,
        "sliding_window_pattern": 6,
        "sliding_window": 4096,
    },
    "gemma2": {"tie_word_embeddings": True, "sliding_window_pattern": 2},
    "gemma": {"tie_word_embeddings": True},
}


def _with_family_defaults(text: dict[str, Any], outer_type: str) -> dict[str, Any]:
    """The config with its family's aliases read and its class defaults filled in."""
    mtype = str(text.get("model_type") or outer_type)
    fam = _FAMILY_DEFAULTS.get(mtype) or _FAMILY_DEFAULTS.get(mtype.removesuffix("_text")) or {}
    missing = {k: v for k, v in fam.items() if k not in text}
    aliased = {new: text[old] for old, new in _ALIASES.items() if old in text and new not in text}
    if not missing and not aliased:
        return text
    return {**text, **missing, **aliased}


def shape_from_config(
    cfg: dict[str, Any], quantization: str | None = None, dtype: str | None = None
) -> ModelShape:
    """The model's shape from config.json; a config no model could have is a ConfigError
    naming the file and the field, never a traceback."""
    path = cfg.get("__path__", "config.json")
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    text = _with_family_defaults(text, str(cfg.get("model_type") or ""))
    if text is not cfg.get("text_config") and "text_config" not in cfg:
        cfg = {**cfg, **text}
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if _get(text, k) is None:
            raise ConfigError(f"{path}: field '{k}' missing: cannot size the model")
    for k in COUNT_FIELDS:
        v = text.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (v == 0 and k in COUNT_FIELDS[:5]):
            raise ConfigError(f"{path}: field '{k}' is {v!r}: it must be a positive whole number")
        if v > COUNT_LIMITS.get(k, 1 << 40):
            raise ConfigError(f"{path}: field '{k}' is {v}: no model has that many")
    _check_quantization(cfg.get("quantization_config") or text.get("quantization_config"), path)
    try:
        s = _shape(cfg, text, quantization, dtype)
    except (TypeError, ValueError, ZeroDivisionError, AttributeError, OverflowError, KeyError) as e:
        raise ConfigError(f"{path}: a field has a value no model has ({type(e).__name__}: {e})") from None
    g = cfg.get("__gguf__")
    if isinstance(g, dict) and not quantization:
        # the file is the weights: its tensors' bytes, exactly, and its own quantisation
        s = dataclasses.replace(
            s,
            gguf=g,
            quant=g.get("file_type") or s.quant,
            exact_bytes=int(g["bytes"]),
            exact_from=f"{Path(str(path)).name}'s tensors",
        )
    return s


@dataclass(slots=True)
class _Dims:
    """The text model's dimensions as config.json gives them."""

    h: int  # hidden size
    L: int  # layers
    H: int  # attention heads
    K: int  # KV heads
    d: int  # head dim
    V: int  # vocabulary
    tied: bool
    mtype: str
    mla: tuple[int, int] | None  # (kv_lora_rank, qk_rope_head_dim) of MLA attention


@dataclass(slots=True)
class _Moe:
    """Which layers are mixture-of-experts, and how wide each kind of MLP is."""

    text: dict[str, Any]
    experts: int
    i_dense: int
    i_moe: int
    shared_i: int
    first_dense: int
    freq: int
    step: int
    mlp_only: set[int]

    def is_moe(self, layer: int) -> bool:
        if not self.experts or layer < self.first_dense or layer in self.mlp_only:
            return False
        if "decoder_sparse_step" in self.text or "interleave_moe_layer_step" in self.text:
            return (layer + 1) % self.step == 0
        return layer % self.freq == 0


def _dims(cfg: dict[str, Any], text: dict[str, Any]) -> _Dims:
    h = int(text["hidden_size"])
    H = int(text["num_attention_heads"])
    kv_lora = text.get("kv_lora_rank")
    return _Dims(
        h=h,
        L=int(text["num_hidden_layers"]),
        H=H,
        K=int(_get(text, "num_key_value_heads", "num_kv_heads", "multi_query_group_num", default=H)),
        d=int(_get(text, "head_dim", default=0) or h // H),
        V=int(text["vocab_size"]),
        tied=bool(_get(text, "tie_word_embeddings", default=cfg.get("tie_word_embeddings", False))),
        mtype=str(text.get("model_type") or cfg.get("model_type") or "unknown"),
        mla=(int(kv_lora), int(text.get("qk_rope_head_dim") or 0)) if kv_lora else None,
    )


def _attention(text: dict[str, Any], m: _Dims) -> tuple[int, dict[str, int]]:
    """Parameters of one layer's attention, and its linear modules by name."""
    h, H, K, d = m.h, m.H, m.K, m.d
    if m.mla:
        rank, rope = m.mla
        nope = int(text.get("qk_nope_head_dim") or 0)
        v = int(text.get("v_head_dim") or nope)
        ql = text.get("q_lora_rank")
        q = (h * ql + ql + ql * H * (nope + rope)) if ql else h * H * (nope + rope)
        attn = q + h * (rank + rope) + rank + rank * H * (nope + v) + H * v * h
        modules = {
            **({"q_a_proj": h * ql, "q_b_proj": ql * H * (nope + rope)} if ql else {"q_proj": q}),
            "kv_a_proj_with_mqa": h * (rank + rope),
            "kv_b_proj": rank * H * (nope + v),
            "o_proj": H * v * h,
        }
        return attn, modules
    attn = h * H * d + 2 * h * K * d + H * d * h
    modules = {"q_proj": h * H * d, "k_proj": h * K * d, "v_proj": h * K * d, "o_proj": H * d * h}
    if text.get("attention_bias") or m.mtype.startswith("qwen2") or m.mtype == "gpt_oss":
        attn += H * d + 2 * K * d + (h if m.mtype == "gpt_oss" else 0)
    if m.mtype == "gpt_oss":
        attn += H  # attention sinks
    return attn, modules


def _moe(text: dict[str, Any], m: _Dims) -> _Moe:
    experts = int(_get(text, "n_routed_experts", "num_experts", "num_local_experts", default=0) or 0)
    i_dense = int(_get(text, "intermediate_size", default=0) or 0)
    i_moe = int(_get(text, "moe_intermediate_size", default=0) or i_dense)
    shared_i = int(text.get("shared_expert_intermediate_size") or 0)
    if not shared_i and text.get("n_shared_experts"):
        shared_i = int(text["n_shared_experts"]) * i_moe
    if m.mtype.startswith("llama4"):
        shared_i = i_dense  # Llama 4: one shared expert as wide as a routed one
        i_dense = int(text.get("intermediate_size_mlp") or i_dense)
    return _Moe(
        text=text,
        experts=experts,
        i_dense=i_dense,
        i_moe=i_moe,
        shared_i=shared_i,
        first_dense=int(text.get("first_k_dense_replace") or 0),
        freq=int(text.get("moe_layer_freq") or 1),
        step=int(_get(text, "decoder_sparse_step", "interleave_moe_layer_step", default=1) or 1),
        mlp_only=set(text.get("mlp_only_layers") or []),
    )


GATED = 3  # gate, up, down


def _shape(
    cfg: dict[str, Any], text: dict[str, Any], quantization: str | None, dtype: str | None
) -> ModelShape:
    m = _dims(cfg, text)
    h, L = m.h, m.L
    attn, attn_modules = _attention(text, m)
    moe = _moe(text, m)
    pattern = text.get("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) == L:
        return _hybrid_shape(cfg, text, quantization, dtype, m, attn, moe.i_dense, pattern)
    partial: list[str] = []
    expert_params = dense_mlp = router = 0.0
    for layer in range(L):
        if moe.is_moe(layer):
            per_expert = GATED * h * moe.i_moe
            if m.mtype == "gpt_oss":
                per_expert += 2 * moe.i_moe + h  # expert biases
            expert_params += moe.experts * per_expert
            dense_mlp += GATED * h * moe.shared_i
            router += h * moe.experts + (moe.experts if m.mtype == "gpt_oss" else 0)
        else:
            dense_mlp += GATED * h * moe.i_dense
    kinds, window = _layer_kinds(text, L)
    if isinstance(text.get("layer_types"), list) and any("linear" in str(t) for t in text["layer_types"]):
        partial.append("linear-attention layers are counted as standard attention for parameters")
    vision, vision_shape = _vision(cfg, h, partial)
    quantizable = L * attn + dense_mlp + expert_params
    kept = m.V * h * (1 if m.tied else 2) + 2 * h * L + h + router + vision
    if quantization is None:
        # modules the checkpoint keeps at the model dtype: counted at the model dtype
        unq, note = _not_converted(cfg, text, L, _layer_modules(text, m, moe, attn_modules))
        if unq:
            quantizable -= unq
            kept += unq
            partial.append(note)
    topk = int(_get(text, "num_experts_per_tok", "experts_per_token", "moe_topk", default=1) or 1)
    width = max(
        moe.i_dense if any(not moe.is_moe(x) for x in range(L)) else 0,
        topk * (moe.i_moe + h // 3) + moe.shared_i if moe.experts else 0,
    )
    shape = _finish(
        width, cfg, text, quantizable, kept, expert_params, partial, quantization, dtype,
        h, L, m.H, m.K, m.d, m.V, m.tied, m.mtype, m.mla, kinds, window,
    )  # fmt: skip
    shape.moe_intermediate = moe.i_moe if moe.experts else 0
    shape.vision = vision_shape
    gd = int(text.get("global_head_dim") or 0)
    gh = int(text.get("num_global_key_value_heads") or 0)
    if (gd or gh) and (gd or m.d, gh or m.K) != (m.d, m.K):
        shape.global_kv = (gh or m.K, gd or m.d)
    return shape


def _hybrid_shape(
    cfg: dict[str, Any],
    text: dict[str, Any],
    quantization: str | None,
    dtype: str | None,
    m: _Dims,
    attn: int,
    i_dense: int,
    pattern: str,
) -> ModelShape:
    """Nemotron-H style: M = Mamba-2 mixer, * = attention, - = MLP, one block per layer."""
    h, L = m.h, m.L
    plain = str(text.get("mlp_hidden_act", "")) in ("relu2", "relu", "gelu")
    mlp = (2 if plain else GATED) * h * i_dense
    nh, hd = int(text.get("mamba_num_heads") or 0), int(text.get("mamba_head_dim") or 0)
    ng, ds = int(text.get("n_groups") or 1), int(text.get("ssm_state_size") or 0)
    d_in = nh * hd or int(text.get("expand") or 2) * h
    conv = int(text.get("conv_kernel") or 4)
    mamba = h * (2 * d_in + 2 * ng * ds + nh) + (d_in + 2 * ng * ds) * conv + d_in * h + 3 * nh + d_in
    quantizable = pattern.count("*") * attn + pattern.count("-") * mlp + pattern.count("M") * mamba
    kept = m.V * h * (1 if m.tied else 2) + L * h + h
    return _finish(
        max(i_dense, 2 * d_in // 3), cfg, text, quantizable, kept, 0.0, [], quantization, dtype,
        h, L, m.H, m.K, m.d, m.V, m.tied, m.mtype, m.mla, [c == "*" for c in pattern], None,
    )  # fmt: skip


def _vision(cfg: dict[str, Any], h: int, partial: list[str]) -> tuple[float, tuple[int, int, int]]:
    """The vision tower's parameters and (width, MLP width, patches profiled), when there is one."""
    vc = cfg.get("vision_config")
    if not isinstance(vc, dict):
        return 0.0, (0, 0, 0)
    # Qwen2-VL: embed_dim is the ViT's width, hidden_size the merger's output (the LLM's)
    vh = int(_get(vc, "embed_dim", "hidden_size", default=0) or 0)
    vl = int(_get(vc, "num_hidden_layers", "depth", default=0) or 0)
    vi = int(_get(vc, "intermediate_size", default=0) or int(vc.get("mlp_ratio") or 4) * vh)
    if not (vh and vl):
        return 0.0, (0, 0, 0)
    gated = str(vc.get("hidden_act", "")) in ("silu", "swiglu")  # Qwen2.5-VL's gated MLP
    vision = vl * (4 * vh * vh + (3 if gated else 2) * vh * vi) + vh * h
    merge = int(vc.get("spatial_merge_size") or 0)
    if merge > 1:  # Qwen-VL's patch merger: (vh·m²)² then to the LLM's width
        wide = vh * merge * merge
        vision += wide * wide + wide * h
        # vLLM profiles one image of the largest size: 16,384 tokens after merging
        patches = 16384 * merge * merge
    else:  # fixed-size images (SigLIP, CLIP): a batch's worth of them, about 8
        side = int(vc.get("image_size") or 896) // max(1, int(vc.get("patch_size") or 14))
        patches = 8 * side * side
    partial.append("vision tower estimated from its hidden size, depth and MLP width")
    return float(vision), (vh, vi, patches)


def _layer_modules(
    text: dict[str, Any], m: _Dims, moe: _Moe, attn_modules: dict[str, int]
) -> Callable[[int], list[tuple[str, float, str]]]:
    """(module name, parameters, kind) of one decoder layer's linear layers; one representative
    expert stands for all of them."""
    moe_block = "block_sparse_moe" if m.mtype in ("mixtral", "minimax", "minimax_m2") else "mlp"
    shared_name = "shared_experts" if text.get("n_shared_experts") else "shared_expert"
    h = m.h

    def layer_modules(layer: int) -> list[tuple[str, float, str]]:
        pre = f"model.layers.{layer}."
        out = [(f"{pre}self_attn.{k}", float(n), "attention") for k, n in attn_modules.items()]
        proj = ("gate_proj", "up_proj", "down_proj")
        if not moe.is_moe(layer):
            return out + [(f"{pre}mlp.{k}", float(h * moe.i_dense), "mlp") for k in proj]
        if moe.shared_i:
            out += [(f"{pre}mlp.{shared_name}.{k}", float(h * moe.shared_i), "shared") for k in proj]
        ex = ("w1", "w3", "w2") if moe_block == "block_sparse_moe" else proj
        return out + [
            (f"{pre}{moe_block}.experts.0.{k}", float(moe.experts * h * moe.i_moe), "experts") for k in ex
        ]

    return layer_modules


def context_limit(text: dict[str, Any]) -> int | None:
    """The longest context the engine derives from config.json: the position limit, times a
    rope-scaling factor where the scaling extends it (yarn from its original length, linear,
    dynamic); llama3/longrope/su/mrope limits are already in max_position_embeddings."""
    base = _get(text, "max_position_embeddings", "max_sequence_length", "seq_length")
    rope = text.get("rope_scaling")
    if not isinstance(base, int) or not isinstance(rope, dict):
        return base
    kind = str(rope.get("rope_type") or rope.get("type") or "")
    factor = rope.get("factor")
    if kind in ("", "default", "llama3", "longrope", "su", "mrope") or not isinstance(factor, (int, float)):
        return base
    if str(text.get("model_type", "")).startswith("gemma3"):
        return base  # Gemma 3's linear factor scales its global layers' rope; 131,072 is the limit
    if factor <= 1:
        return base
    if kind == "yarn" and isinstance(rope.get("original_max_position_embeddings"), int):
        base = rope["original_max_position_embeddings"]
    return int(base * factor)


def _not_converted(
    cfg: dict[str, Any], text: dict[str, Any], L: int, layer_modules: Any
) -> tuple[float, str]:
    """Parameters of linear layers a quantised checkpoint leaves unquantised: fbgemm_fp8
    quantises only the MLPs (Llama 3.1 405B FP8: attention stays bf16), and
    `modules_to_not_convert` / `ignored_layers` / `ignore` / `exclude_modules` name modules as
    the engines match them: a full name or a module above it (`model.layers.3.self_attn`), a
    glob (`model.layers.*.self_attn`), a `re:` pattern (`re:.*shared_experts.*`), or one bare
    name component (`lm_head`, `gate`: the router, not `gate_proj`)."""
    import fnmatch

    q = cfg.get("quantization_config") or text.get("quantization_config") or {}
    if not isinstance(q, dict) or not q:
        return 0.0, ""
    method = str(q.get("quant_method") or "").lower()
    listed = [
        str(x)
        for key in ("modules_to_not_convert", "ignored_layers", "ignore", "exclude_modules")
        for x in q.get(key) or []
    ]
    exact = {x for x in listed if not x.startswith("re:") and "*" not in x}
    globs = [x for x in listed if "*" in x and not x.startswith("re:")]
    patterns = []
    for x in listed:
        if x.startswith("re:"):
            try:
                patterns.append(re.compile(x[3:]))
            except re.error:
                continue
    words = {x for x in exact if "." not in x}

    def kept(name: str) -> bool:
        parts = name.split(".")
        if any(".".join(parts[:n]) in exact for n in range(1, len(parts) + 1)) or words & set(parts):
            return True
        if any(fnmatch.fnmatchcase(name, g) or fnmatch.fnmatchcase(name, g + ".*") for g in globs):
            return True
        return any(p.fullmatch(name) or p.fullmatch(name.replace(".0.", ".")) for p in patterns)

    ffn_only = method == "fbgemm_fp8"  # FFN-only FP8: attention stays at the model dtype
    total = 0.0
    kinds: set[str] = set()
    if listed or ffn_only:
        for layer in range(L):
            for name, n, kind in layer_modules(layer):
                if (ffn_only and kind == "attention") or kept(name):
                    total += n
                    kinds.add(kind)
    if not total:
        return 0.0, ""
    what = "attention (FFN-only FP8)" if ffn_only else "the modules quantization_config leaves out"
    return (
        total,
        f"{total / 1e9:.2f} B parameters of {what} kept at the model dtype ({', '.join(sorted(kinds))})",
    )


def _finish(
    mlp_width: int,
    cfg: dict[str, Any],
    text: dict[str, Any],
    quantizable: float,
    kept: float,
    expert_params: float,
    partial: list[str],
    quantization: str | None,
    dtype: str | None,
    h: int,
    L: int,
    H: int,
    K: int,
    d: int,
    V: int,
    tied: bool,
    mtype: str,
    mla: tuple[int, int] | None,
    kinds: list[bool | None],
    window: int | None,
) -> ModelShape:
    """Quantization, dtype and KV layout; then the shape."""
    qcfg = cfg.get("quantization_config") or text.get("quantization_config") or {}
    method = (quantization or qcfg.get("quant_method") or qcfg.get("quantization") or "").lower() or None
    if method == "compressed-tensors":
        groups = qcfg.get("config_groups") or {}
        fmt = json.dumps(groups).lower()
        method = (
            "fp8"
            if "float" in fmt and '"num_bits": 8' in fmt
            else "nvfp4"
            if "float" in fmt and '"num_bits": 4' in fmt
            else "int4"
            if '"num_bits": 4' in fmt
            else "int8"
        )
    elif method == "modelopt":
        algo = str(qcfg.get("quant_algo") or "fp8").lower()
        method = "nvfp4" if "fp4" in algo else "int4" if "w4a" in algo or "int4" in algo else "fp8"
    layout = _int4_layout(qcfg) if method in ("int4", "awq", "gptq") and not quantization else None
    if method and method not in QUANT_BYTES:
        partial.append(f"quantization {method!r} unknown here: weights sized at the model dtype")
        method = None
    torch_dtype = str(
        dtype or _get(text, "torch_dtype", "dtype", default=cfg.get("torch_dtype") or "bfloat16")
    )
    dbytes = float(DTYPE_BYTES.get(torch_dtype.replace("torch.", ""), 2))
    n_attn_kv = sum(1 for k in kinds if k is not False)
    n_window = sum(1 for k in kinds if k is None)
    src = Path(cfg.get("__path__", "model/config.json"))
    name = str(
        cfg.get("_name_or_path") or (src.parent.name if src.name == "config.json" else src.stem) or "MODEL"
    )
    return ModelShape(
        name=name,
        model_type=mtype,
        vocab=V,
        hidden=h,
        layers=L,
        heads=H,
        kv_heads=K,
        head_dim=d,
        tied=tied,
        max_position=context_limit(text),
        dtype_bytes=dbytes,
        quant=method,
        mla=mla,
        attn_layers=n_attn_kv,
        window_layers=n_window,
        window=window,
        params_quantizable=quantizable,
        params_kept=kept,
        expert_params=expert_params,
        partial=partial,
        mlp_width=mlp_width or 4 * h,
        int4_layout=layout or (INT4_GROUP, True),
    )


def _int4_layout(q: dict[str, Any]) -> tuple[int, bool]:
    """(group size, whether zero points are stored) of an int4 checkpoint: GPTQ and AWQ store
    packed zeros even when symmetric; compressed-tensors stores none when symmetric (Kimi K2.5:
    group 32, symmetric → 0.5625 bytes a weight, not 0.52)."""
    w: dict[str, Any] = {}
    for g in (q.get("config_groups") or {}).values():
        if isinstance(g, dict) and isinstance(g.get("weights"), dict):
            w = g["weights"]
            break
    group = w.get("group_size", q.get("group_size", q.get("q_group_size", INT4_GROUP)))
    try:
        group = int(group)
    except (TypeError, ValueError):
        group = INT4_GROUP
    if group <= 0:
        group = 1 << 30  # per channel: one scale per output row, negligible per weight
    zeros = not bool(w.get("symmetric")) if w else True
    return group, zeros


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


@dataclass
class Plan:
    shape: ModelShape
    gpus: int
    gpu_total_gib: float
    used_gib: float
    tp: int
    pp: int
    util: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_dtype: str
    engine: str
    units: EngineUnits  # how the engine sizes memory and spells its launch
    engine_version: str | None = None
    eager: bool = False  # no CUDA graphs: none to subtract
    weights_room_gib: float = 0.0  # what the weights may take on a GPU (the engine's own way)
    gpu_layers: int = 0  # layer-offload engines: layers on the GPUs (of layers + 1, the output)
    weights_gib_per_gpu: float = 0.0
    activation_gib: float = 0.0
    overhead_gib: float = 0.0
    kv_gib_per_gpu: float = 0.0
    kv_tokens: int = 0
    max_concurrency: float = 0.0
    longest_context_for_seqs: int = 0
    fits: bool = False
    reasons: list[str] = field(default_factory=list)
    what_would: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)
    gpu_name: str | None = None  # when a snapshot names the GPUs: what their hardware supports

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.shape.name,
            "params_total": int(self.shape.params_total),
            "weights_gib_per_gpu": round(self.weights_gib_per_gpu, 2),
            "kv_bytes_per_token": int(kv_bytes_per_token(self.shape, self.kv_dtype, 1)),
            "kv_bytes_per_token_per_gpu": int(kv_bytes_per_token(self.shape, self.kv_dtype, self.tp)),
            "activation_gib": round(self.activation_gib, 2),
            "overhead_gib": round(self.overhead_gib, 2),
            "kv_gib_per_gpu": round(self.kv_gib_per_gpu, 2),
            "kv_tokens": self.kv_tokens,
            "max_concurrency": round(self.max_concurrency, 2),
            "max_model_len": self.max_model_len,
            "longest_context_for_max_num_seqs": self.longest_context_for_seqs,
            "tensor_parallel_size": self.tp,
            "pipeline_parallel_size": self.pp,
            "gpus": self.gpus,
            "gpu_total_gib": self.gpu_total_gib,
            "gpu_memory_utilization": self.util,
            "fits": self.fits,
            "why_not": self.reasons,
            "what_would_fit": self.what_would,
            "partial": self.shape.partial,
            "assumptions": self.assumptions,
            "weights_from": self.shape.exact_from or "config arithmetic",
            "engine": self.engine,
            "kv_budget": self.units.kv_budget,
            **(
                {"gpu_layers": self.gpu_layers, "layers": self.shape.layers + 1}
                if self.units.kv_budget == "layers"
                else {}
            ),
            # a launch only when it fits: anything else would be a command that cannot work
            "launch": launch_text(self) if self.fits else None,
        }


# What vLLM's profiling pass measures as its "activation peak" and "non-torch memory", fitted
# to the engines' own reports in real logs (tests/test_measured.py keeps the rows):
#  - the forward pass of the dummy batch: per token the widest MLP's fused gate-up, activation
#    and down outputs (3 × width) and three hidden-size buffers, at the model dtype;
#  - the dummy sampler run on the last position of each sequence: fp32 logits over the whole
#    vocabulary, live several times over. Up to 0.11 the dummy run samples with top-k and top-p,
#    whose PyTorch-native path sorts the logits (values and int64 indices), then scatters and
#    softmaxes them: 8.5 copies (0.10.2: 5.58 GiB measured for 1,024 × 151,936 logits with a
#    0.66 GiB forward). Later versions measure about 2.5 copies (0.17.1, 0.22.1).
#  - V0 profiles one sampler pass over plain logits (0.6.4: 2.99 GiB for 29,000 tokens); other
#    engines hold one fp32 logits buffer for their batch (TensorRT-LLM, TGI, LMDeploy).
SAMPLER_COPIES = {"one": 1.0, "v1-sorting": 8.5, "v1": 2.5}
# Memory outside torch's allocator that the budget subtracts. V1 (0.8+) counts only what
# profiling adds (0.02-0.07 GiB measured on one GPU; NCCL and custom all-reduce buffers with
# TP), not the CUDA context; V0 from 0.6.4 counted the process's whole non-torch use (0.35 GiB
# measured), and before it the peak came from the device's free memory, so the CUDA context and
# torch's cached blocks were in it too (0.75 GiB).
# From 0.21 V1 also subtracts the CUDA graphs it will capture ("CUDA graph memory profiling is
# enabled (default since v0.21.0)"; 0.14-0.96 GiB measured, by how many sizes are captured).
NON_TORCH_GIB = {"v0-free-memory": 0.75, "v0": 0.35, "v1": 0.05}
TP_BUFFERS_GIB = 0.25
GRAPHS_GIB = 0.75
GRAPHS_FEW_SEQS_GIB = 0.15  # max_num_seqs under 32: a few capture sizes


def version_tuple(version: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a vLLM version such as 0.10.2 or v0.11.0rc1 (compares with
    (0, 12) as a version does); None for v0/v1 or none."""
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", (version or "").strip().lower())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def engine_defaults(
    units: EngineUnits, version: str | None, total_gib: float, gpu_name: str | None
) -> tuple[int, int, str]:
    """vLLM's V1 defaults for max_num_batched_tokens and max_num_seqs (the API server's): 8192
    and 1024 on GPUs of 70 GiB or more except the A100, else 2048 and 256; V0: 256 sequences."""
    if units.model == "vllm" and engine_generation(version) == "v0":
        return 2048, 256, "V0"
    big = total_gib >= 70 and "a100" not in (gpu_name or "").lower()
    where = f"a {round(total_gib, 1):g} GiB GPU" + (f" ({gpu_name})" if gpu_name else "")
    return (8192, 1024, where) if big else (2048, 256, where)


def activation_gib(
    s: ModelShape, batched_tokens: int, seqs: int, tp: int, units: EngineUnits, version: str | None = None
) -> float:
    """The activation peak of the profiling pass: the dummy batch's forward pass plus the dummy
    sampler run on min(max_num_seqs, batched tokens) sequences (see SAMPLER_COPIES)."""
    per_token = (3 * s.mlp_width + 3 * s.hidden) * s.dtype_bytes / tp
    forward = batched_tokens * per_token
    logits = min(seqs, batched_tokens) * s.vocab * 4  # gathered over TP: the whole vocabulary
    text = forward + logits * SAMPLER_COPIES[_sampler_kind(units, version)]
    vh, vi, patches = s.vision
    if units.profile == "dummy_batch" and patches:
        # the encoder is profiled on its own, on dummy images of the largest size (vllm-419:
        # Qwen2-VL's 32-layer ViT, 65,536 patches: 2.65 GiB, more than the text pass)
        encoder = patches * (3 * vi + 4 * vh) * s.dtype_bytes / tp
        return max(text, encoder) / GIB
    return text / GIB


def _sampler_kind(units: EngineUnits, version: str | None) -> str:
    if units.profile != "dummy_batch" or engine_generation(version) == "v0":
        return "one"
    v = version_tuple(version)
    return "v1-sorting" if v is not None and v < (0, 12) else "v1"


def overhead_gib(units: EngineUnits, version: str | None, shards: int, seqs: int, eager: bool) -> float:
    """Non-torch memory (and, from vLLM 0.21, the CUDA graphs) the engine subtracts before the KV
    cache. The generic engine keeps the seed guide's CUDA context + allocator slack."""
    if units.model != "vllm":
        return 0.75 + (0.5 if shards > 1 else 0.0)
    gen = engine_generation(version) or "v1"
    v = version_tuple(version)
    kind = "v0-free-memory" if gen == "v0" and v is not None and v < (0, 6, 4) else gen
    out = NON_TORCH_GIB[kind] + (TP_BUFFERS_GIB if shards > 1 else 0.0)
    if gen == "v1" and not eager and (v is None or v >= (0, 21)):
        out += GRAPHS_GIB if seqs >= 32 else GRAPHS_FEW_SEQS_GIB
    return out


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
        chosen = _evaluate(base)
        if not chosen.fits:
            chosen.what_would = _what_would_layers(chosen)
        if gguf_note:
            chosen.assumptions.insert(0, gguf_note)
        return chosen
    candidates = [tp] if tp else [t for t in range(1, max(1, gpus // pp) + 1) if s.heads % t == 0]
    chosen = base
    for t in candidates:
        chosen = _variant(base, tp=t)
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


def engine_generation(version: str | None) -> str | None:
    """'v0' or 'v1' from --engine-version (`v0`, `v1`, or a vLLM version: V1 is the default
    from 0.8.0 and the only engine from 0.11.0); None when not given."""
    if not version:
        return None
    v = version.strip().lower().lstrip("v")
    if v in ("0", "1"):
        return "v" + v
    m = re.match(r"(\d+)\.(\d+)", v)
    if not m:
        raise InputError(f"--engine-version {version!r}: give v0, v1 or a version such as 0.6.6")
    major, minor = int(m.group(1)), int(m.group(2))
    return "v0" if (major, minor) < (0, 8) else "v1"


def profiled_tokens(
    units: EngineUnits,
    version: str | None,
    chunked: bool | None,
    given: int | None,
    length: int,
    total_gib: float,
    gpu_name: str | None = None,
) -> tuple[int, str]:
    """The tokens of the dummy batch vLLM profiles before it sizes the KV cache (its activation
    peak grows with them), and how they were chosen."""
    if given:
        return given, f"activation peak for max_num_batched_tokens={given} (given)"
    gen = engine_generation(version)
    if units.model == "vllm" and gen == "v0":
        on = chunked if chunked is not None else length > 32768  # the API server's V0 default
        if not on:
            # V0 without chunked prefill: one prefill of a whole max-length prompt
            n = max(length, 2048)
            return (
                n,
                f"V0 without chunked prefill: the profiled batch is max(max_model_len, 2048) = {n} tokens",
            )
        return 2048, "V0 with chunked prefill: the profiled batch is 2048 tokens (assumed)"
    n, _, where = engine_defaults(units, version, total_gib, gpu_name)
    src = f"engine {gen}" if gen else "V1 assumed (give --engine-version for V0)"
    return n, f"{src}: max_num_batched_tokens defaults to {n} on {where}"


def _outside_share(p: Plan, kind: str) -> tuple[float, float] | None:
    """Engines whose KV share leaves the rest for activations: (the GiB left beside it, what
    else must fit there besides the activations); None for the others."""
    if kind == "free_static":  # SGLang: (1 − mem_fraction_static) of the free memory
        return (1 - p.util) * (p.gpu_total_gib - p.used_gib), p.overhead_gib
    if kind == "free_after_weights" and p.units.activations == "in_rest":  # of what the weights left
        return (1 - p.util) * (p.gpu_total_gib - p.used_gib - p.weights_gib_per_gpu - p.overhead_gib), 0.0
    return None


def _fitting(q: Plan) -> tuple[Plan, int | None]:
    """The plan if it fits; else, when its weights fit and only the context does not, the same
    plan at the longest context its KV cache holds (and that length); else the plan, None."""
    if q.fits or q.kv_gib_per_gpu < 0:
        return q, None
    shorter = min(q.kv_tokens // 1024 * 1024, q.shape.max_position or q.max_model_len)
    if 1024 <= shorter < q.max_model_len:
        r = _variant(q, max_model_len=shorter)
        if r.fits:
            return r, shorter
    return q, None


def fitting_share(p: Plan) -> float | None:
    """When the activations do not fit beside the engine's KV share: the largest share, in 0.05
    steps, with which the plan fits; None otherwise."""
    if not any(r.startswith("activations need") for r in p.reasons):
        return None
    for step in range(int(p.util * 20) - 1, 5, -1):
        if _variant(p, util=step / 20).fits:
            return step / 20
    return None


def _what_would(p: Plan) -> list[str]:
    """When nothing fits: the nearest launches that would, in the engine's own flags."""
    s = p.shape
    flags = p.units.flags
    ctx_flag = flags.get("max_model_len", "--max-model-len")
    out: list[str] = []
    fp8 = fp8_supported(p.gpu_name)
    q, shorter = _fitting(p)
    if shorter:
        out.append(f"a shorter context: {ctx_flag} {shorter} at tp={p.tp}")
    share = fitting_share(p)
    if share:
        util_flag = flags.get("gpu_memory_utilization", "gpu_memory_utilization")
        out.append(f"a smaller KV share: {util_flag} {share:.2f} leaves the activations room")
    kv_flag = flags.get("kv_cache_dtype")
    if p.kv_dtype in ("auto", "") and not s.mla and fp8 is not False and kv_flag:
        q = _variant(p, kv_dtype="fp8")
        if q.fits:
            out.append(f"an fp8 KV cache ({kv_flag} fp8) at tp={p.tp}: {q.kv_tokens:,} tokens")
    valid_tps = [t for t in range(1, max(1, p.gpus // p.pp) + 1) if s.heads % t == 0]
    if s.quant is None:
        for method in ("fp8", "int4") if fp8 is not False else ("int4",):
            found = None
            for t in valid_tps:
                q, shorter = _fitting(_variant(p, shape=dataclasses.replace(s, quant=method), tp=t))
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
        q, shorter = _fitting(_variant(p, tp=t, gpus=t * p.pp))
        if q.fits:
            out.append(
                f"more GPUs: tp={t} on {t * p.pp} GPUs of {round(p.gpu_total_gib, 1):g} GiB"
                + (f" with {ctx_flag} {shorter}" if shorter else "")
            )
            if not shorter:
                break
    return out


def _variant(p: Plan, **inputs: Any) -> Plan:
    """The same scenario with some inputs changed, evaluated afresh."""
    return _evaluate(dataclasses.replace(p, **inputs))


def _evaluate(p: Plan) -> Plan:
    """Fill the computed fields of a plan from its inputs."""
    if p.units.kv_budget == "layers":
        return _evaluate_layers(p)
    s, tp, pp, kind = p.shape, p.tp, p.pp, p.units.kv_budget
    p.reasons, p.assumptions, p.what_would = [], [], []
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
        out.append(
            f"weights need {p.weights_gib_per_gpu:.1f} GiB per GPU, the budget is {budget:.1f} GiB"
            if kind != "free_after_weights"
            else f"weights need {p.weights_gib_per_gpu:.1f} GiB per GPU, {budget:.1f} GiB are free"
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
    p.reasons, p.assumptions, p.what_would = [], [], []
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


def _what_would_layers(p: Plan) -> list[str]:
    s, units = p.shape, p.units
    out: list[str] = []
    ctx_flag = units.flags.get("max_model_len", "max_model_len")
    length = p.max_model_len // 1024 * 1024
    while length >= 1024:
        q = _variant(p, max_model_len=length)
        if q.fits:
            out.append(f"a shorter context: {ctx_flag} {length} puts all {s.layers + 1} layers on the GPU")
            break
        length -= 1024
    if p.kv_dtype in ("auto", "", "f16"):
        q = _variant(p, kv_dtype="q8_0")
        if q.fits:
            kv_flag = units.flags.get("kv_cache_dtype", "kv_cache_dtype")
            out.append(f"a q8_0 KV cache ({kv_flag} q8_0, with flash attention) puts all layers on the GPU")
    order = ["q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "q3_k_m", "q2_k"]
    if s.quant in order:
        for smaller in order[order.index(s.quant) + 1 :]:
            q = _variant(p, shape=dataclasses.replace(s, quant=smaller))
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


def launch_text(p: Plan) -> str:
    """The launch in the engine's own spelling (its profile's launch head and flags): flags on
    the command line, `env:` flags as variables before it, bare names (Ollama's num_ctx) as
    Modelfile parameters. The generic engine gets its YAML config."""
    s, units = p.shape, p.units
    layers = units.kv_budget == "layers"
    fit_len = p.max_model_len if p.max_concurrency >= 1 else max(1024, p.kv_tokens // 1024 * 1024)
    fit_len = min(fit_len, s.max_position or fit_len)
    if units.launch is None:
        seqs = max(1, int(p.kv_tokens / max(1, fit_len)))
        return (
            f"tensor_parallel_size: {p.tp}\ngpu_memory_utilization: {p.util:.2f}\n"
            f"max_concurrent_requests: {min(seqs, p.max_num_seqs)}\n"
        )
    params: list[tuple[str, Any]] = []
    if layers:
        params += [("max_model_len", p.max_model_len), ("gpu_layers", p.gpu_layers)]
        if p.max_num_seqs > 1:
            params.append(("max_num_seqs", p.max_num_seqs))
    else:
        params.append(("tensor_parallel_size", p.tp))
        if p.pp > 1:
            params.append(("pipeline_parallel_size", p.pp))
        params += [("max_model_len", fit_len), ("gpu_memory_utilization", f"{p.util:.2f}")]
    if p.kv_dtype not in ("auto", ""):
        params.append(("kv_cache_dtype", p.kv_dtype))
    env, args, model_params = [], [], []
    for canon, value in params:
        flag = units.flags.get(canon)
        if not flag:
            continue
        if flag.startswith("env:"):
            env.append(f"{flag[4:]}={value}")
        elif flag.startswith("-"):
            args.append(f"{flag} {value}")
        else:
            model_params.append(f"PARAMETER {flag} {value}")
    head = units.launch.format(model=s.name)
    if model_params:  # a Modelfile: the model's own parameters
        lines = [head, *model_params]
        if env:
            lines.append(f"# the server: {' '.join(env)}")
        return "\n".join(lines)
    return " ".join([*env, head, *args])


_GPUS_RE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\d+(?:\.\d+)?)\s*(?:G(?:i)?B?)?\s*$")


# what a user meant as NxGIB when it is not a file: digits, an x, something number-like
_GPUS_LIKE = re.compile(r"^\s*[-+]?[\d.e+-]*\s*[xX×]\s*[-+]?[\d.eE+-]+\s*(?:G(?:i)?B?)?\s*$")


def parse_gpus_spec(spec: str) -> tuple[int, float] | None:
    """`2x80` → (2, 80.0): two GPUs of 80 GiB. None when it is not that form; an InputError
    when it is, with a count or size that cannot be (0x80, 2x0, 2x-80, 1x1e400)."""
    m = _GPUS_RE.match(spec)
    if not m:
        if _GPUS_LIKE.match(spec) and not os.path.exists(spec):
            raise ConfigError(f"--gpus {spec}: give N×GiB as two positive numbers, e.g. 2x80")
        return None
    n, gib = int(m.group(1)), float(m.group(2))
    if n < 1 or n > 4096:
        raise ConfigError(f"--gpus {spec}: the GPU count must be between 1 and 4096")
    if not 0 < gib <= 4096:
        raise ConfigError(f"--gpus {spec}: the memory per GPU must be between 0 and 4096 GiB")
    return n, gib


def checkpoint_quant(cfg: dict[str, Any]) -> str | None:
    """The quantisation the checkpoint itself carries (config.json's quantization_config)."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    q = cfg.get("quantization_config") or text.get("quantization_config") or {}
    m = q.get("quant_method") if isinstance(q, dict) else None
    return str(m).lower() if m else None


def with_checkpoint(
    s: ModelShape, where: str | None, runtime_quant: str | None = None, stored_quant: str | None = None
) -> ModelShape:
    """The shape with the checkpoint's own byte count when its files are at `where` (the model
    directory, or beside config.json). A quantisation applied at load time (`--quantization fp8`
    of a bf16 checkpoint) changes the bytes: the arithmetic stays then."""
    from .checkpoint import checkpoint_bytes

    if where is None:
        return s
    found = checkpoint_bytes(where)
    if found is None:
        return s
    if runtime_quant and runtime_quant.lower() != (stored_quant or ""):
        s.partial.append(
            f"the checkpoint's {found[0] / GIB:.1f} GiB change with --quantization {runtime_quant}"
        )
        return s
    return dataclasses.replace(s, exact_bytes=found[0], exact_from=found[1])
