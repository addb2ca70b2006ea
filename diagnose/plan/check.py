"""`diagnose check -- vllm serve …`: catch a launch that cannot work before it is run. The launch
is judged where the engine puts it (the first GPUs visible, or its CUDA_VISIBLE_DEVICES), by
the budget `plan` uses; each change it proposes is one of the search's alternatives, which the
same budget accepted, and the command with them made is given to copy."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..advice.core import len_down
from ..budget.alternatives import Proposal, at_size, valid_sizes
from ..budget.architecture import shape_from_config
from ..budget.config import ConfigError, checkpoint_quant, load_config
from ..budget.plan import Plan
from ..budget.search import plan
from ..budget.shape import with_checkpoint
from ..budget.units import engine_units
from ..host.gpu_pool import GpuPool
from ..knowledge.engine_profiles import Profiles, flag_for
from ..knowledge.settings_in_force import default_of
from ..model.records import Change
from ..model.typed_facts import as_int
from .launch_command import installed_version, leading_env, parse_launch, with_changes

VERIFY = "run `diagnose check` again, then start it under `diagnose watch`"

# the parameter a proposal of each kind changes first (others come with it in the fixed launch)
_MAIN = {
    "parallel": "tensor_parallel_size",
    "more_gpus": "tensor_parallel_size",
    "context": "max_model_len",
    "share": "gpu_memory_utilization",
    "kv_dtype": "kv_cache_dtype",
    "quantization": "quantization",
    "free_gpus": "action:free_gpu",
    "placement": "env:CUDA_VISIBLE_DEVICES",
}


def preflight(
    cmd: list[str],
    config_path: str | None,
    pool: GpuPool | None,
    profiles: Profiles,
    engine_version: str | None = None,
) -> dict[str, Any]:
    """Whether this launch can work on these GPUs: each problem with the change that fixes it,
    and the launch with those changes made."""
    c = _Preflight(cmd, profiles, pool)
    c.read_model(config_path)
    c.read_version(engine_version)
    if c.can_tell():
        c.judge()
    else:
        c.check_parallel_unsized()
    c.check_length()
    if pool is None:
        c.notes.append("no GPU information: pass --gpus FILE (nvidia-smi output) or --gpus 2x80")
    _check_port(c.launch, c.engine, profiles, c.problem)
    fixed = None
    if c.problems and c.engine != "generic" and all(p["change"] for p in c.problems):  # a whole fix only
        changes = {**c.extra_changes}
        for p in c.problems:
            if p["change"] and not p["param"].startswith("action:"):
                changes[p["param"]] = p["change"]["to"]
        fixed = " ".join(with_changes(cmd, changes, c.engine, profiles))
        if fixed == " ".join(w for w in cmd if w != "--"):
            fixed = None  # the fix is outside the command (free a GPU)
    return {
        "ok": not c.problems,
        # the model's shape against the GPUs: without both, only the launch itself was read
        "memory_checked": c.can_tell(),
        "engine": c.engine,
        "summary": " ".join(cmd)[:120],
        "launch": c.launch,
        "problems": c.problems,
        "notes": c.notes,
        "fixed_launch": fixed,
    }


class _Preflight:
    def __init__(self, cmd: list[str], profiles: Profiles, pool: GpuPool | None):
        self.engine, self.launch = parse_launch(cmd, profiles)
        self.env = leading_env(cmd)
        self.profiles, self.pool = profiles, pool
        self.problems: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.extra_changes: dict[str, Any] = {}  # what the fix needs besides the problems' own
        self.proposals: list[Proposal] = []  # the search's, when the launch does not fit
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

    def can_tell(self) -> bool:
        """Can the budget hold the model against the GPUs (a shape and a GPU size)?"""
        return self.shape is not None and self.pool is not None

    def plan_as_launched(self) -> Plan:
        """The launch where the engine puts it, with the search's alternatives when it does not fit."""
        launch = self.launch
        assert self.pool is not None
        return plan(
            self.shape,
            self.pool.count,
            0.0,
            0.0,
            self.tp,
            self.pp,
            self.util,
            self._length(),
            as_int(launch.get("max_num_seqs")),
            as_int(launch.get("max_num_batched_tokens")),
            str(launch.get("kv_cache_dtype") or "auto"),
            self.engine,
            engine_version=self.version,
            chunked_prefill=_bool_or_none(launch.get("enable_chunked_prefill")),
            eager=bool(_bool_or_none(launch.get("enforce_eager"))),
            units=self.units,
            pool=self.pool,
            engine_order=True,
        )

    def _length(self) -> int | None:
        """The context judged: the one asked, or the model's own longest where more was asked
        (that is a problem of its own)."""
        asked, longest = as_int(self.launch.get("max_model_len")), self.shape.max_position
        return min(asked, int(longest)) if asked and longest else asked

    def judge(self) -> None:
        """The launch against the budget: the parallel size first (the GPUs it needs, the heads
        it splits), then memory; each problem's change is the search's first proposal."""
        p, pool = self.plan_as_launched(), self.pool
        assert pool is not None
        self.proposals = p.proposals
        if self.units.kv_budget == "layers":
            self.check_layers(p)
            return
        first = p.proposals[0] if p.proposals else None
        parallel = first if first is not None and first.kind in ("parallel", "placement") else None
        tp, shape = self.tp, self.shape
        structural = []
        if tp * self.pp > pool.count:
            structural.append(f"tensor × pipeline parallel = {tp * self.pp} GPUs, {pool.count} visible")
        if shape.heads % tp:
            structural.append(f"{shape.heads} attention heads are not divisible by {tp}")
        for text in structural:
            unfit = "" if parallel else self._nearest_unfit(p)
            self._propose("tensor_parallel_size", text + unfit, parallel, tp)
        if structural and parallel:
            return
        judged = p if not structural else self._at_nearest(p)
        self._check_memory(judged, p.proposals)
        self.notes.append(
            f"plan: {judged.weights_gib_per_gpu:.1f} GiB weights and {judged.kv_tokens:,} KV tokens per GPU "
            f"at tp={judged.tp}"
            + (
                f" on GPU{'s' if len(judged.devices) > 1 else ''} {','.join(map(str, judged.devices))}"
                if judged.devices
                else ""
            )
        )

    def _at_nearest(self, p: Plan) -> Plan:
        assert self.pool is not None
        sizes = sorted(valid_sizes(p, self.pool), key=lambda d: (abs(d - self.tp), -d))
        return at_size(p, sizes[0], self.pool) if sizes else p

    def _nearest_unfit(self, p: Plan) -> str:
        q = self._at_nearest(p)
        what = "the weights do" if q.kv_gib_per_gpu < 0 else "the launch does"
        return f"; at {q.tp} {what} not fit either"

    def _propose(self, param: str, text: str, pr: Proposal | None, frm: Any) -> None:
        """A problem whose change is this proposal's (its other changes go into the fixed launch)."""
        if pr is None:
            self.problem(param, text, None, "", frm)
            return
        main = _MAIN.get(pr.kind, param)
        if main not in pr.changes:
            main = param
        if main != param or frm is None:
            frm = self.tp if main == "tensor_parallel_size" else self.launch.get(main)
        if main.startswith("env:"):
            frm = self.env.get(main[4:])
        self.problem(main, text, pr.changes.get(main), pr.text, frm)
        self.extra_changes.update({k: v for k, v in pr.changes.items() if k != main})
        self.problems[-1]["how"] = pr.text
        self.problems[-1]["alternatives"] = [
            o.text for o in self.proposals if o is not pr and o.kind != "more_gpus"
        ]

    def _check_memory(self, p: Plan, proposals: list[Proposal]) -> None:
        """The memory budget at the launch's parallel size: weights, activations, one request;
        then what others already hold on its GPUs."""
        elsewhere = [pr for pr in proposals if pr.kind == "more_gpus"]  # not a change on these GPUs
        proposals = [pr for pr in proposals if pr.kind != "more_gpus"]
        first = proposals[0] if proposals else None
        if p.kv_gib_per_gpu < 0:
            need = (
                f"the weights need {p.weights_gib_per_gpu:.1f} GiB per GPU, "
                f"{max(0.0, p.weights_room_gib):.1f} GiB are available"
            )
            busy = [g for g in self.pool.busy if g.index in (p.devices or ())] if self.pool else []
            if busy:
                need += " (" + ", ".join(f"GPU {g.index} has {g.used_gib:.1f} GiB in use" for g in busy) + ")"
            if first is None or first.kind not in ("parallel", "placement", "free_gpus"):
                need += ", and no parallel size on these GPUs fits"
            if first is None:
                need += "; no quantisation these GPUs run makes them fit: more or larger GPUs"
            self._propose(
                "quantization" if first is None else _MAIN.get(first.kind, "quantization"), need, first, None
            )
            if first is None and elsewhere:
                self.problems[-1]["alternatives"] = [pr.text for pr in elsewhere]
            return  # what others hold there is in the proposals (a GPU freed, the launch moved)
        elif (act := next((r for r in p.reasons if r.startswith("activations need")), None)) is not None:
            self._propose("gpu_memory_utilization", act, first, f"{self.util:.2f}")
        elif p.max_concurrency < 1:
            text = f"the KV cache would hold {p.kv_tokens} tokens, less than one request of {p.max_model_len}"
            if first is None and p.kv_tokens >= 256:  # no alternative: the longest context it holds
                self.problem(
                    "max_model_len",
                    text,
                    len_down(p.kv_tokens),
                    f"the budget leaves {p.kv_gib_per_gpu:.1f} GiB per GPU for the KV cache",
                    p.max_model_len,
                )
            else:
                self._propose("max_model_len", text, first, p.max_model_len)
        self._others_on_the_gpu(p)

    def check_parallel_unsized(self) -> None:
        """Without the budget: the parallel size against the GPUs visible and the heads."""
        tp, pp, pool, shape = self.tp, self.pp, self.pool, self.shape
        heads = shape.heads if shape is not None else None
        if pool is not None and tp * pp > pool.count:
            to = _valid_tp(heads, max(1, pool.count // pp))
            self.problem(
                "tensor_parallel_size",
                f"tensor × pipeline parallel = {tp * pp} GPUs, {pool.count} visible",
                to,
                f"{pool.count} GPUs are visible" + (f" and {to} divides the {heads} heads" if heads else ""),
                tp,
            )
        if heads is not None and heads % tp:
            to = _valid_tp(heads, pool.count // pp if pool else tp)
            self.problem(
                "tensor_parallel_size",
                f"{heads} attention heads are not divisible by {tp}",
                to,
                f"{to} divides the {heads} heads",
                tp,
            )

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

    def check_layers(self, p: Plan) -> None:
        """Layer-offload engines: the GPU layers asked for against those that fit."""
        shape = self.shape
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

    def _others_on_the_gpu(self, p: Plan) -> None:
        """Memory other processes hold on the launch's GPUs: a share of the total cannot count it
        (a share of free memory does)."""
        total, used = p.gpu_total_gib, p.used_gib
        if not (used > 0 and total and self.units.kv_budget != "free_static"):
            return
        moved = "env:CUDA_VISIBLE_DEVICES" in self.extra_changes
        if moved or any(x["param"] in ("action:free_gpu", "env:CUDA_VISIBLE_DEVICES") for x in self.problems):
            return  # the fix already moves the launch off the busy GPUs or frees them
        free_frac = (total - used) / total
        if self.util > free_frac:
            to = math.floor(free_frac / 0.05) * 0.05
            busy = [g.index for g in self.pool.busy if g.index in (p.devices or ())] if self.pool else []
            on = f" on GPU{'s' if len(busy) > 1 else ''} {','.join(map(str, busy))}" if busy else ""
            self.problem(
                "gpu_memory_utilization",
                f"{used:.1f} GiB are already in use{on}: {self.util:.2f} of the GPU is not free",
                f"{to:.2f}" if to >= 0.3 else None,
                "what is free on the busiest GPU the launch runs on",
                f"{self.util:.2f}",
            )


def _bool_or_none(v: Any) -> bool | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v.strip().lower() not in ("0", "false", "no", "off", "")
    return bool(v)


def _valid_tp(heads: int | None, cap: int) -> int:
    if heads is None:
        p = 1
        while p * 2 <= cap:
            p *= 2
        return p
    return max(d for d in range(1, max(1, cap) + 1) if heads % d == 0)


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
