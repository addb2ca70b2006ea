"""The model's shape (`ModelShape`): what the budget needs of an architecture, finished with its
dtype, quantisation and context length; exact weight bytes from a checkpoint when at hand.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .units import DTYPE_BYTES, GIB, INT4_GROUP, QUANT_BYTES


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


def config_value(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def context_limit(text: dict[str, Any]) -> int | None:
    """The longest context the engine derives from config.json: the position limit, times a
    rope-scaling factor where the scaling extends it (yarn from its original length, linear,
    dynamic); llama3/longrope/su/mrope limits are already in max_position_embeddings."""
    base = config_value(text, "max_position_embeddings", "max_sequence_length", "seq_length")
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


def not_converted(cfg: dict[str, Any], text: dict[str, Any], L: int, layer_modules: Any) -> tuple[float, str]:
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


def finish_shape(
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
        dtype or config_value(text, "torch_dtype", "dtype", default=cfg.get("torch_dtype") or "bfloat16")
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
