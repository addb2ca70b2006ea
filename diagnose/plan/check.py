"""`diagnose check -- vllm serve …`: catch a launch that cannot work before it is run."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

import yaml

from ..advice.core import len_down
from ..base.errors import InputError
from ..budget.architecture import shape_from_config
from ..budget.config import ConfigError, checkpoint_quant, load_config
from ..budget.search import fitting_share, plan
from ..budget.shape import with_checkpoint
from ..budget.units import engine_units
from ..knowledge.engine_profiles import Profiles, flag_for
from ..knowledge.settings_in_force import default_of
from ..model.records import Change
from ..model.typed_facts import as_int

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
    from ..read.launch_args import _parse_command_line, canonical_launch

    if profiles is None:
        from ..knowledge.engine_profiles import load_profiles

        profiles = load_profiles()
    generic = profiles.get("generic")
    if len(cmd) == 1 and cmd[0].endswith((".yaml", ".yml")) and Path(cmd[0]).is_file():
        try:
            data = yaml.safe_load(Path(cmd[0]).read_text()) or {}
        except yaml.YAMLError as e:
            from ..base.errors import yaml_problem

            raise InputError(f"{cmd[0]}: not valid YAML: {yaml_problem(e)}") from None
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
    """Whether this launch can work on these GPUs: each problem with the change that fixes it."""
    c = _Preflight(cmd, profiles, gpus, total_gib, used_gib, gpu_name)
    c.read_model(config_path)
    c.read_version(engine_version)
    c.check_parallel()
    c.check_length()
    if c.shape is not None and total_gib is not None and c.units.kv_budget == "layers":
        c.check_layers()
    elif c.shape is not None and total_gib is not None:
        c.check_budget()
    elif gpus is None:
        c.notes.append("no GPU information: pass --gpus FILE (nvidia-smi output) or --gpus 2x80")
    _check_port(c.launch, c.engine, profiles, c.problem)
    return {
        "ok": not c.problems,
        # the model's shape against the GPUs: without both, only the launch itself was read
        "memory_checked": c._can_tell(),
        "engine": c.engine,
        "summary": " ".join(cmd)[:120],
        "launch": c.launch,
        "problems": c.problems,
        "notes": c.notes,
    }


class _Preflight:
    def __init__(
        self,
        cmd: list[str],
        profiles: Profiles,
        gpus: int | None,
        total_gib: float | None,
        used_gib: float,
        gpu_name: str | None,
    ):
        self.engine, self.launch = parse_launch(cmd, profiles)
        self.profiles, self.gpus, self.total_gib, self.used_gib, self.gpu_name = (
            profiles,
            gpus,
            total_gib,
            used_gib,
            gpu_name,
        )
        self.problems: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.tp = int(self.launch.get("tensor_parallel_size") or 1)
        self.pp = int(self.launch.get("pipeline_parallel_size") or 1)
        said = self.launch.get("gpu_memory_utilization")
        self.util = float(said or default_of("gpu_memory_utilization", profiles, self.engine))
        self.units = engine_units(self.engine, profiles)
        self.shape: Any = None
        self.version: str | None = None

    def problem(self, param: str, text: str, to: Any, why: str, frm: Any = None) -> None:
        ch = None
        if to is not None:
            fl = flag_for(self.profiles, self.engine, param)
            frm_s = None if frm is None else str(frm)
            ch = Change(param=param, flag=fl, frm=frm_s, to=str(to), why=why, verify=VERIFY).to_json()
        self.problems.append({"param": param, "text": text, "change": ch})

    def read_model(self, config_path: str | None) -> None:
        launch = self.launch
        model = launch.get("model")
        path = config_path or (model if model and Path(str(model)).is_dir() else None)
        if not path:
            self.notes.append(
                "no config.json: pass --config (or a local model directory) for the memory checks"
            )
            return
        try:
            cfg = load_config(str(path))
            self.shape = with_checkpoint(
                shape_from_config(cfg, launch.get("quantization"), launch.get("dtype")),
                str(Path(cfg["__path__"]).parent),
                launch.get("quantization"),
                checkpoint_quant(cfg),
            )
        except ConfigError as e:
            self.notes.append(f"no model arithmetic: {e}")
        if self.shape is not None and self.shape.partial:
            self.notes.extend(f"partial estimate: {p}" for p in self.shape.partial)

    def read_version(self, engine_version: str | None) -> None:
        version = engine_version or installed_version(self.profiles, self.engine)
        if version and self.units.model == "vllm":
            self.notes.append(
                f"vLLM {version}"
                + (" (given)" if engine_version else " (installed here)")
                + ": its profiling batch, sampler and CUDA-graph accounting"
            )
        self.version = version if self.units.model == "vllm" else None

    def plan_at(self, tp_size: int | None, gpu_count: int, model: Any = None, max_len: Any = None) -> Any:
        launch = self.launch
        return plan(
            model or self.shape,
            gpu_count,
            self.total_gib,
            self.used_gib,
            tp_size,
            self.pp,
            self.util,
            max_len or launch.get("max_model_len"),
            as_int(launch.get("max_num_seqs")),
            as_int(launch.get("max_num_batched_tokens")),
            str(launch.get("kv_cache_dtype") or "auto"),
            self.engine,
            gpu_name=self.gpu_name,
            engine_version=self.version,
            chunked_prefill=_bool_or_none(launch.get("enable_chunked_prefill")),
            eager=bool(_bool_or_none(launch.get("enforce_eager"))),
            units=self.units,
        )

    def check_parallel(self) -> None:
        tp, pp, gpus, shape = self.tp, self.pp, self.gpus, self.shape
        if gpus is not None and tp * pp > gpus:
            to, unfit = self._parallel_that_fits(max(1, gpus // pp))
            self.problem(
                "tensor_parallel_size",
                f"tensor × pipeline parallel = {tp * pp} GPUs, {gpus} visible" + unfit,
                None if unfit else to,
                f"{gpus} GPUs are visible" + (f" and {to} divides the {shape.heads} heads" if shape else ""),
                tp,
            )
        if shape is not None and shape.heads % tp:
            to, unfit = self._parallel_that_fits(gpus // pp if gpus else tp)
            self.problem(
                "tensor_parallel_size",
                f"{shape.heads} attention heads are not divisible by {tp}" + unfit,
                None if unfit else to,
                f"{to} divides the {shape.heads} heads"
                + (" and the launch fits there" if self._can_tell() else ""),
                tp,
            )

    def _can_tell(self) -> bool:
        """Can the budget hold the model against the GPUs (a shape and a GPU size)?"""
        return self.shape is not None and self.total_gib is not None

    def _plan_at_size(self, size: int, max_len: Any = None) -> Any:
        """The plan at this parallel size, on the GPUs given (or as many as it takes)."""
        return self.plan_at(size, max(self.gpus or size * self.pp, size * self.pp), max_len=max_len)

    def _parallel_that_fits(self, cap: int) -> tuple[int, str]:
        """The parallel size nearest the one asked, within `cap`, that divides the heads and (when
        the budget can tell) whose launch fits by the same budget that judges this one; and, when
        none does, why the nearest does not (else ""). The context is the one asked, or the
        model's own longest where more was asked (that is a problem of its own)."""
        heads = self.shape.heads if self.shape is not None else None
        if not self._can_tell():
            return _valid_tp(heads, cap), ""
        options = [d for d in range(1, max(1, cap) + 1) if (heads % d == 0 if heads else d & (d - 1) == 0)]
        ordered = sorted(options, key=lambda d: (abs(d - self.tp), -d))
        asked, longest = as_int(self.launch.get("max_model_len")), self.shape.max_position
        length = min(asked, int(longest)) if asked and longest else asked
        for d in ordered:
            if self._plan_at_size(d, length).fits:
                return d, ""
        nearest = ordered[0]
        unfit = self._plan_at_size(nearest, length)
        what = "the weights do" if any("weights need" in r for r in unfit.reasons) else "the launch does"
        return nearest, f"; at {nearest} {what} not fit either"

    def check_length(self) -> None:
        shape, asked = self.shape, self.launch.get("max_model_len")
        if shape is not None and shape.max_position and asked and int(asked) > int(shape.max_position):
            self.problem(
                "max_model_len",
                f"max_model_len {asked} is above max_position_embeddings {shape.max_position}",
                shape.max_position,
                "the model was trained for this length",
                asked,
            )

    def check_layers(self) -> None:
        """Layer-offload engines: the GPU layers asked for against those that fit."""
        shape = self.shape
        p = self.plan_at(self.tp, max(self.gpus or 1, 1))
        asked = as_int(self.launch.get("gpu_layers"))
        if asked is not None and 0 <= p.gpu_layers < min(asked, shape.layers + 1):
            shorter = next((w for w in p.what_would if w.startswith("a shorter context")), None)
            self.problem(
                "gpu_layers",
                f"{asked} layers asked on the GPU, {p.gpu_layers} of {shape.layers + 1} fit beside "
                f"{p.kv_tokens:,} tokens of context" + (f" ({shorter})" if shorter else ""),
                p.gpu_layers,
                f"{p.weights_gib_per_gpu:.1f} GiB of layers and {p.kv_gib_per_gpu:.1f} GiB of KV cache fit",
                asked,
            )
        self.notes.append(
            f"plan: {p.gpu_layers} of {shape.layers + 1} layers on the GPU at {p.kv_tokens:,} tokens"
        )

    def check_budget(self) -> None:
        """The memory budget at the launch's parallel size: weights, activations, one request."""
        tp = self.tp
        p = self._plan_at_size(tp)
        if p.kv_gib_per_gpu < 0:
            self._weights_do_not_fit(p)
        elif (act := next((r for r in p.reasons if r.startswith("activations need")), None)) is not None:
            share = fitting_share(p)
            self.problem(
                "gpu_memory_utilization",
                act,
                f"{share:.2f}" if share else None,
                "the largest share that still leaves the activations and CUDA graphs their room",
                f"{self.util:.2f}",
            )
        elif p.max_concurrency < 1:
            self.problem(
                "max_model_len",
                f"the KV cache would hold {p.kv_tokens} tokens, less than one request of {p.max_model_len}",
                len_down(p.kv_tokens) if p.kv_tokens >= 256 else None,
                f"the budget leaves {p.kv_gib_per_gpu:.1f} GiB per GPU for the KV cache",
                p.max_model_len,
            )
        self._others_on_the_gpu()
        self.notes.append(
            f"plan: {p.weights_gib_per_gpu:.1f} GiB weights and {p.kv_tokens:,} KV tokens per GPU at tp={tp}"
        )

    def _weights_do_not_fit(self, p: Any) -> None:
        tp, budget, n = self.tp, p.weights_room_gib, self.gpus or self.tp * self.pp
        better = self.plan_at(None, n)
        need = f"the weights need {p.weights_gib_per_gpu:.1f} GiB per GPU, {budget:.1f} GiB are available"
        if better.fits and better.tp != tp:
            why = f"at {better.tp} GPUs the weights take {better.weights_gib_per_gpu:.1f} GiB each"
            self.problem("tensor_parallel_size", need, better.tp, why, tp)
            return
        quant, why = _fitting_quantization(self.shape, self.plan_at, n, self.gpu_name)
        self.problem(
            "quantization",
            need
            + ", and no parallel size on these GPUs fits"
            + ("" if quant else "; no quantisation these GPUs run makes them fit: more or larger GPUs"),
            quant,
            why,
            self.launch.get("quantization"),
        )

    def _others_on_the_gpu(self) -> None:
        """Memory other processes hold: a share of the total cannot count it (a share of free memory does)."""
        total, used = self.total_gib, self.used_gib
        if not (used > 0 and total and self.units.kv_budget != "free_static"):
            return
        free_frac = (total - used) / total
        if self.util > free_frac:
            to = math.floor(free_frac / 0.05) * 0.05
            self.problem(
                "gpu_memory_utilization",
                f"{used:.1f} GiB are already in use: {self.util:.2f} of the GPU is not free",
                f"{to:.2f}" if to >= 0.3 else None,
                "what is free on the busiest GPU",
                f"{self.util:.2f}",
            )


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

    from ..budget.search import fp8_supported

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
    from ..host.ports import free_port, port_holder, port_taken

    default = profiles.get(engine).defaults.get("port")
    port = launch.get("port") or default
    try:
        port = int(port) if port is not None else None
    except (TypeError, ValueError, OverflowError):  # "http", nan, inf
        port = -1
    if port is None:
        return
    if not 0 < port < 65536:
        problem(
            "port",
            f"port {launch.get('port')} is not a TCP port (1–65535)",
            default or 8000,
            "a valid port",
            launch.get("port"),
        )
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
