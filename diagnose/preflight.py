"""`diagnose check -- vllm serve …`: catch a launch that cannot work before it is run."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

import yaml

from .advice.core import as_int, len_down
from .budget import (
    ConfigError,
    checkpoint_quant,
    engine_units,
    fitting_share,
    load_config,
    plan,
    shape_from_config,
    with_checkpoint,
)
from .engines import Profiles, flag_for
from .errors import InputError
from .model import Change

VERIFY = "run `diagnose check` again, then start it under `diagnose watch`"

# Parameters a launch cannot give a value below 1 to, and shares of memory in (0, 1].
COUNTS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
)


def engine_of_command(joined: str, profiles: Profiles) -> str | None:
    """The engine whose profile knows this command line (its `command_line` launch marker)."""
    for name, prof in sorted(profiles.by_engine.items()):
        for m in prof.markers:
            if m.what == "launch" and m.kind == "command_line" and m.search(joined):
                return name
    return None


def parse_launch(cmd: list[str], profiles: Profiles | None = None) -> tuple[str, dict[str, Any]]:
    """The engine and its parameters (canonical names) from a launch command or the generic
    engine's YAML config. One reader serves `check`, `run` and the launch lines in logs: the
    engine from its profile's command-line marker, the names from its profile."""
    from .launch import _parse_command_line, canonical_launch

    if profiles is None:
        from .engines import load_profiles

        profiles = load_profiles()
    generic = profiles.get("generic")
    if len(cmd) == 1 and cmd[0].endswith((".yaml", ".yml")) and Path(cmd[0]).is_file():
        try:
            data = yaml.safe_load(Path(cmd[0]).read_text()) or {}
        except yaml.YAMLError as e:
            raise InputError(f"{cmd[0]}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise InputError(f"{cmd[0]}: the generic engine's config must be a mapping")
        launch = canonical_launch({str(k): v for k, v in data.items()}, generic.names)
        return "generic", _checked(launch, "generic", profiles)
    joined = " ".join(shlex.quote(w) if " " in w else w for w in cmd) if len(cmd) > 1 else cmd[0]
    engine = engine_of_command(joined, profiles)
    if engine is None:
        known = sorted(
            n for n, p in profiles.by_engine.items() if any(m.kind == "command_line" for m in p.markers)
        )
        raise InputError(
            f"{joined[:80]}: not a server launch diagnose knows (engines with a command line: "
            f"{', '.join(known)}); for the generic engine pass its YAML config"
        )
    names = {**generic.names, **profiles.get(engine).names}
    return engine, _checked(canonical_launch(_parse_command_line(joined), names), engine, profiles)


def _checked(launch: dict[str, Any], engine: str, profiles: Profiles) -> dict[str, Any]:
    """Values a server would refuse are named here, as the flag the user typed."""
    for key in COUNTS:
        v = launch.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{flag_for(profiles, engine, key)} {v}: must be a whole number of at least 1")
    util = launch.get("gpu_memory_utilization")
    if util is not None and (
        isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1
    ):
        raise InputError(
            f"{flag_for(profiles, engine, 'gpu_memory_utilization')} {util}: must be a fraction in (0, 1]"
        )
    return launch


def preflight(
    cmd: list[str],
    config_path: str | None,
    gpus: int | None,
    total_gib: float | None,
    used_gib: float,
    profiles: Profiles,
    gpu_name: str | None = None,
    engine_version: str | None = None,
) -> dict[str, Any]:
    engine, launch = parse_launch(cmd, profiles)
    problems: list[dict[str, Any]] = []
    notes: list[str] = []
    tp = int(launch.get("tensor_parallel_size") or 1)
    pp = int(launch.get("pipeline_parallel_size") or 1)
    util_default = float(profiles.get(engine).defaults.get("gpu_memory_utilization") or 0.9)
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
            cfg = load_config(str(path))
            shape = with_checkpoint(
                shape_from_config(cfg, launch.get("quantization"), launch.get("dtype")),
                str(Path(cfg["__path__"]).parent),
                launch.get("quantization"),
                checkpoint_quant(cfg),
            )
        except ConfigError as e:
            notes.append(f"no model arithmetic: {e}")
    else:
        notes.append("no config.json: pass --config (or a local model directory) for the memory checks")
    if shape is not None and shape.partial:
        notes.extend(f"partial estimate: {p}" for p in shape.partial)

    units = engine_units(engine, profiles)
    version = engine_version or installed_version(profiles, engine)
    if version and units.model == "vllm":
        notes.append(
            f"vLLM {version}"
            + (" (given)" if engine_version else " (installed here)")
            + ": its profiling batch, sampler and CUDA-graph accounting"
        )

    def plan_at(tp_size: int | None, gpu_count: int, model: Any = None) -> Any:
        return plan(
            model or shape,
            gpu_count,
            total_gib,
            used_gib,
            tp_size,
            pp,
            util,
            launch.get("max_model_len"),
            as_int(launch.get("max_num_seqs")),
            as_int(launch.get("max_num_batched_tokens")),
            str(launch.get("kv_cache_dtype") or "auto"),
            engine,
            gpu_name=gpu_name,
            engine_version=version if units.model == "vllm" else None,
            chunked_prefill=_bool_or_none(launch.get("enable_chunked_prefill")),
            eager=bool(_bool_or_none(launch.get("enforce_eager"))),
            units=units,
        )

    def weights_fit(to: int) -> bool:
        """Whether the budget takes the weights at this parallel size (True when it cannot tell)."""
        if shape is None or total_gib is None:
            return True
        q = plan_at(to, max(gpus or to * pp, to * pp))
        return not any("weights need" in r for r in q.reasons)

    if gpus is not None and tp * pp > gpus:
        to = _valid_tp(shape.heads if shape else None, max(1, gpus // pp))
        fits = weights_fit(to)
        problem(
            "tensor_parallel_size",
            f"tensor × pipeline parallel = {tp * pp} GPUs, {gpus} visible"
            + ("" if fits else f"; at {to} the weights do not fit either"),
            to if fits else None,
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
    if shape is not None and total_gib is not None and units.kv_budget == "layers":
        p = plan_at(tp, max(gpus or 1, 1))
        asked = as_int(launch.get("gpu_layers"))
        if asked is not None and 0 <= p.gpu_layers < min(asked, shape.layers + 1):
            shorter = next((w for w in p.what_would if w.startswith("a shorter context")), None)
            problem(
                "gpu_layers",
                f"{asked} layers asked on the GPU, {p.gpu_layers} of {shape.layers + 1} fit beside "
                f"{p.kv_tokens:,} tokens of context" + (f" ({shorter})" if shorter else ""),
                p.gpu_layers,
                f"{p.weights_gib_per_gpu:.1f} GiB of layers and {p.kv_gib_per_gpu:.1f} GiB of KV cache fit",
                asked,
            )
        notes.append(
            f"plan: {p.gpu_layers} of {shape.layers + 1} layers on the GPU at {p.kv_tokens:,} tokens"
        )
    elif shape is not None and total_gib is not None:
        p = plan_at(tp, max(gpus or tp * pp, tp * pp))
        budget = p.weights_room_gib
        if p.kv_gib_per_gpu < 0:
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
                quant, why = _fitting_quantization(shape, plan_at, gpus or tp * pp, gpu_name)
                problem(
                    "quantization",
                    f"the weights need {p.weights_gib_per_gpu:.1f} GiB per GPU, {budget:.1f} GiB "
                    "are available, and no parallel size on these GPUs fits"
                    + (
                        ""
                        if quant
                        else "; no quantisation these GPUs run makes them fit: more or larger GPUs"
                    ),
                    quant,
                    why,
                    launch.get("quantization"),
                )
        elif (act := next((r for r in p.reasons if r.startswith("activations need")), None)) is not None:
            share = fitting_share(p)
            problem(
                "gpu_memory_utilization",
                act,
                f"{share:.2f}" if share else None,
                "the largest share that still leaves the activations and CUDA graphs their room",
                f"{util:.2f}",
            )
        elif p.max_concurrency < 1:
            to = len_down(p.kv_tokens) if p.kv_tokens >= 256 else None
            problem(
                "max_model_len",
                f"the KV cache would hold {p.kv_tokens} tokens, less than one request of {p.max_model_len}",
                to,
                f"the budget leaves {p.kv_gib_per_gpu:.1f} GiB per GPU for the KV cache",
                p.max_model_len,
            )
        if used_gib > 0 and units.kv_budget != "free_static":  # a share of free memory counts the others
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
    _check_port(launch, engine, profiles, problem)
    summary = " ".join(cmd)[:120]
    return {
        "ok": not problems,
        "engine": engine,
        "summary": summary,
        "launch": launch,
        "problems": problems,
        "notes": notes,
    }


def _bool_or_none(v: Any) -> bool | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v.strip().lower() not in ("0", "false", "no", "off", "")
    return bool(v)


def installed_version(profiles: Profiles, engine: str) -> str | None:
    """The engine's version as installed on this host (its profile's `memory.package`): a check
    runs where the server will."""
    from importlib.metadata import PackageNotFoundError, version

    package = profiles.get(engine).memory.get("package")
    if not package:
        return None
    try:
        return version(package)
    except (PackageNotFoundError, ValueError):
        return None


def _valid_tp(heads: int | None, cap: int) -> int:
    if heads is None:
        p = 1
        while p * 2 <= cap:
            p *= 2
        return p
    return max(d for d in range(1, max(1, cap) + 1) if heads % d == 0)


def _fitting_quantization(
    shape: Any, plan_at: Any, gpus: int, gpu_name: str | None
) -> tuple[str | None, str]:
    """The quantisation these GPUs run that makes the weights fit, if any (fp8 first)."""
    import dataclasses

    from .budget import fp8_supported

    methods = ("fp8", "awq") if fp8_supported(gpu_name) is not False else ("awq",)
    for method in methods:
        r = plan_at(None, gpus, dataclasses.replace(shape, quant="int4" if method == "awq" else method))
        if not any("weights need" in x for x in r.reasons):
            what = (
                "fp8 halves bf16 weights"
                if method == "fp8"
                else "an int4 (AWQ/GPTQ) checkpoint quarters them"
            )
            return method, f"{what}: {r.weights_gib_per_gpu:.1f} GiB per GPU at tp={r.tp}"
    return None, "no quantisation fits: more GPUs or GPUs with more memory"


def _check_port(launch: dict[str, Any], engine: str, profiles: Profiles, problem: Any) -> None:
    """The port the server would bind, taken on this host already (and by whom)."""
    from .hostports import free_port, port_holder, port_taken

    port = launch.get("port") or profiles.get(engine).defaults.get("port")
    try:
        port = int(port) if port is not None else None
    except (TypeError, ValueError):
        return
    if port is None or not 0 < port < 65536:
        return
    if not port_taken(port, str(launch.get("host") or "0.0.0.0")):
        return
    who = port_holder(port)
    held = f" by pid {who[0]} ({who[1][:60]})" if who else ""
    to = free_port(port + 1)
    problem(
        "port",
        f"port {port} is already taken on this host{held}",
        to,
        "a port this host can bind now",
        port,
    )
