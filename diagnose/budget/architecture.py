"""Parameters counted from the architecture in config.json: embeddings, attention (MHA, GQA, MQA,
DeepSeek's MLA), dense MLPs and every MoE expert, hybrid (Mamba) layers, vision towers;
family defaults and aliases for the fields a config leaves out or names its own way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import ConfigError, check_quantization
from .shape import ModelShape, config_value, finish_shape, not_converted


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
        if config_value(text, k) is None:
            raise ConfigError(f"{path}: field '{k}' missing: cannot size the model")
    for k in COUNT_FIELDS:
        v = text.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (v == 0 and k in COUNT_FIELDS[:5]):
            raise ConfigError(f"{path}: field '{k}' is {v!r}: it must be a positive whole number")
        if v > COUNT_LIMITS.get(k, 1 << 40):
            raise ConfigError(f"{path}: field '{k}' is {v}: no model has that many")
    check_quantization(cfg.get("quantization_config") or text.get("quantization_config"), path)
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
        K=int(config_value(text, "num_key_value_heads", "num_kv_heads", "multi_query_group_num", default=H)),
        d=int(config_value(text, "head_dim", default=0) or h // H),
        V=int(text["vocab_size"]),
        tied=bool(config_value(text, "tie_word_embeddings", default=cfg.get("tie_word_embeddings", False))),
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
    experts = int(config_value(text, "n_routed_experts", "num_experts", "num_local_experts", default=0) or 0)
    i_dense = int(config_value(text, "intermediate_size", default=0) or 0)
    i_moe = int(config_value(text, "moe_intermediate_size", default=0) or i_dense)
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
        step=int(config_value(text, "decoder_sparse_step", "interleave_moe_layer_step", default=1) or 1),
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
        unq, note = not_converted(cfg, text, L, _layer_modules(text, m, moe, attn_modules))
        if unq:
            quantizable -= unq
            kept += unq
            partial.append(note)
    topk = int(config_value(text, "num_experts_per_tok", "experts_per_token", "moe_topk", default=1) or 1)
    width = max(
        moe.i_dense if any(not moe.is_moe(x) for x in range(L)) else 0,
        topk * (moe.i_moe + h // 3) + moe.shared_i if moe.experts else 0,
    )
    shape = finish_shape(
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
    return finish_shape(
        max(i_dense, 2 * d_in // 3), cfg, text, quantizable, kept, 0.0, [], quantization, dtype,
        h, L, m.H, m.K, m.d, m.V, m.tied, m.mtype, m.mla, [c == "*" for c in pattern], None,
    )  # fmt: skip


def _vision(cfg: dict[str, Any], h: int, partial: list[str]) -> tuple[float, tuple[int, int, int]]:
    """The vision tower's parameters and (width, MLP width, patches profiled), when there is one."""
    vc = cfg.get("vision_config")
    if not isinstance(vc, dict):
        return 0.0, (0, 0, 0)
    # Qwen2-VL: embed_dim is the ViT's width, hidden_size the merger's output (the LLM's)
    vh = int(config_value(vc, "embed_dim", "hidden_size", default=0) or 0)
    vl = int(config_value(vc, "num_hidden_layers", "depth", default=0) or 0)
    vi = int(config_value(vc, "intermediate_size", default=0) or int(vc.get("mlp_ratio") or 4) * vh)
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
