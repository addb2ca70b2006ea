"""`diagnose check -- vllm serve …`: catch a launch that cannot work before it is run."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

import yaml

from .advice import len_down
from .budget import ConfigError, load_config, plan, shape_from_config
from .engines import Profiles, flag_for
from .errors import InputError
from .model import Change

ALIASES = {
    "tp": "tensor_parallel_size",
    "pp": "pipeline_parallel_size",
    "dp": "data_parallel_size",
    "q": "quantization",
    "model_path": "model",
    "model_id": "model",
    "tp_size": "tensor_parallel_size",
    "pp_size": "pipeline_parallel_size",
    "num_shard": "tensor_parallel_size",
    "mem_fraction_static": "gpu_memory_utilization",
    "cuda_memory_fraction": "gpu_memory_utilization",
    "context_length": "max_model_len",
    "max_total_tokens": "max_model_len",
    "max_running_requests": "max_num_seqs",
    "max_concurrent_requests": "max_num_seqs",
}
VERIFY = "run `diagnose check` again, then start it under `diagnose watch`"


def detect_engine(cmd: list[str]) -> str:
    joined = " ".join(cmd)
    if "sglang" in joined:
        return "sglang"
    if "text-generation-launcher" in joined:
        return "tgi"
    if "vllm" in joined:
        return "vllm"
    return "generic"


def parse_launch(cmd: list[str]) -> tuple[str, dict[str, Any]]:
    """The engine and its parameters (canonical names) from a launch command or a YAML config."""
    if len(cmd) == 1 and cmd[0].endswith((".yaml", ".yml")) and Path(cmd[0]).is_file():
        try:
            data = yaml.safe_load(Path(cmd[0]).read_text()) or {}
        except yaml.YAMLError as e:
            raise InputError(f"{cmd[0]}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise InputError(f"{cmd[0]}: the generic engine's config must be a mapping")
        return "generic", {ALIASES.get(k, k): v for k, v in data.items()}
    if len(cmd) == 1:
        cmd = shlex.split(cmd[0])
    engine = detect_engine(cmd)
    out: dict[str, Any] = {}
    i = 0
    while i < len(cmd):
        w = cmd[i]
        if w.startswith("-") and len(w) > 1 and not _number(w):
            key = w.lstrip("-")
            val: Any = True
            if "=" in key:
                key, val = key.split("=", 1)
            elif i + 1 < len(cmd) and (not cmd[i + 1].startswith("-") or _number(cmd[i + 1])):
                val = cmd[i + 1]
                i += 1
            key = key.replace("-", "_")
            out[ALIASES.get(key, key)] = _scalar(val)
        elif i > 0 and cmd[i - 1] in ("serve",) and "model" not in out:
            out["model"] = w
        i += 1
    return engine, out


def _number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _scalar(v: Any) -> Any:
    if isinstance(v, str):
        for conv in (int, float):
            try:
                return conv(v)
            except ValueError:
                pass
    return v


def preflight(
    cmd: list[str],
    config_path: str | None,
    gpus: int | None,
    total_gib: float | None,
    used_gib: float,
    profiles: Profiles,
) -> dict[str, Any]:
    engine, launch = parse_launch(cmd)
    problems: list[dict[str, Any]] = []
    notes: list[str] = []
    tp = int(launch.get("tensor_parallel_size") or 1)
    pp = int(launch.get("pipeline_parallel_size") or 1)
    util_default = 0.88 if engine == "sglang" else 1.0 if engine == "tgi" else 0.9
    util = float(launch.get("gpu_memory_utilization") or util_default)

    def problem(param: str, text: str, to: Any, why: str, frm: Any = None) -> None:
        ch = None
        if to is not None:
            fl = flag_for(profiles, engine, param)
            ch = Change(
                param=param,
                flag=fl,
                frm=None if frm is None else str(frm),
                to=str(to),
                why=why,
                verify=VERIFY,
            ).to_json()
        problems.append({"param": param, "text": text, "change": ch})

    shape = None
    path = config_path or (
        launch.get("model") if launch.get("model") and Path(str(launch["model"])).is_dir() else None
    )
    if path:
        try:
            shape = shape_from_config(load_config(str(path)), launch.get("quantization"), launch.get("dtype"))
        except ConfigError as e:
            notes.append(f"no model arithmetic: {e}")
    else:
        notes.append("no config.json: pass --config (or a local model directory) for the memory checks")
    if shape is not None and shape.partial:
        notes.extend(f"partial estimate: {p}" for p in shape.partial)

    if gpus is not None and tp * pp > gpus:
        to = _valid_tp(shape.heads if shape else None, max(1, gpus // pp))
        problem(
            "tensor_parallel_size",
            f"tensor × pipeline parallel = {tp * pp} GPUs, {gpus} visible",
            to,
            f"{gpus} GPUs are visible" + (f" and {to} divides the {shape.heads} heads" if shape else ""),
            tp,
        )
    if shape is not None and shape.heads % tp:
        to = _valid_tp(shape.heads, min(tp, gpus or tp))
        problem(
            "tensor_parallel_size",
            f"{shape.heads} attention heads are not divisible by {tp}",
            to,
            f"{to} divides the {shape.heads} heads",
            tp,
        )
    if (
        shape is not None
        and shape.max_position
        and launch.get("max_model_len")
        and int(launch["max_model_len"]) > int(shape.max_position)
    ):
        problem(
            "max_model_len",
            f"max_model_len {launch['max_model_len']} is above max_position_embeddings {shape.max_position}",
            shape.max_position,
            "the model was trained for this length",
            launch["max_model_len"],
        )
    if shape is not None and total_gib is not None:
        run_engine = "sglang" if engine == "sglang" else "vllm"

        def plan_at(tp_size: int | None, gpu_count: int) -> Any:
            return plan(
                shape,
                gpu_count,
                total_gib,
                used_gib,
                tp_size,
                pp,
                util,
                launch.get("max_model_len"),
                int(launch.get("max_num_seqs") or 256),
                None,
                str(launch.get("kv_cache_dtype") or "auto"),
                run_engine,
            )

        p = plan_at(tp, max(gpus or tp * pp, tp * pp))
        budget = total_gib * util - used_gib
        if p.weights_gib_per_gpu > budget - p.activation_gib - p.overhead_gib:
            better = plan_at(None, gpus or tp * pp)
            if better.fits and better.tp != tp:
                problem(
                    "tensor_parallel_size",
                    f"the weights need {p.weights_gib_per_gpu:.1f} GiB per GPU, "
                    f"{budget:.1f} GiB are available",
                    better.tp,
                    f"at {better.tp} GPUs the weights take {better.weights_gib_per_gpu:.1f} GiB each",
                    tp,
                )
            else:
                problem(
                    "quantization",
                    f"the weights need {p.weights_gib_per_gpu:.1f} GiB per GPU, {budget:.1f} GiB "
                    "are available, and no parallel size on these GPUs fits",
                    "fp8",
                    "fp8 halves bf16 weights (or add GPUs)",
                    launch.get("quantization"),
                )
        elif p.kv_tokens < p.max_model_len:
            to = len_down(p.kv_tokens) if p.kv_tokens >= 256 else None
            problem(
                "max_model_len",
                f"the KV cache would hold {p.kv_tokens} tokens, less than one request of {p.max_model_len}",
                to,
                f"the budget leaves {p.kv_gib_per_gpu:.1f} GiB per GPU for the KV cache",
                p.max_model_len,
            )
        if used_gib > 0 and engine != "sglang":
            free_frac = (total_gib - used_gib) / total_gib
            if util > free_frac:
                to = math.floor(free_frac / 0.05) * 0.05
                problem(
                    "gpu_memory_utilization",
                    f"{used_gib:.1f} GiB are already in use: {util:.2f} of the GPU is not free",
                    f"{to:.2f}" if to >= 0.3 else None,
                    "what is free on the busiest GPU",
                    f"{util:.2f}",
                )
        notes.append(
            f"plan: {p.weights_gib_per_gpu:.1f} GiB weights and {p.kv_tokens:,} KV tokens per GPU at tp={tp}"
        )
    elif gpus is None:
        notes.append("no GPU information: pass --gpus FILE (nvidia-smi output) or --gpus 2x80")
    summary = " ".join(cmd)[:120]
    return {
        "ok": not problems,
        "engine": engine,
        "summary": summary,
        "launch": launch,
        "problems": problems,
        "notes": notes,
    }


def _valid_tp(heads: int | None, cap: int) -> int:
    if heads is None:
        p = 1
        while p * 2 <= cap:
            p *= 2
        return p
    return max(d for d in range(1, max(1, cap) + 1) if heads % d == 0)
