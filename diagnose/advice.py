"""The next concrete change: one parameter, a value computed from the evidence, why, how to verify.

One change at a time (seed 003): the first Change is the one to make; the rest are ranked
alternatives. Values are ones a careful operator would pick: utilisation on a 0.05 grid and
never above 0.95, context lengths on a 1024 grid at or below what the KV cache holds,
parallel sizes that divide the heads and fit the GPUs.
"""

from __future__ import annotations

import math
import re

from .engines import Profiles, flag_for
from .hostports import free_port, port_holder
from .model import Change, Finding
from .params import fill_template
from .records import record
from .settings import value_in_force
from .taxonomy import TAXONOMY

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~4 ms of every start)
if TYPE_CHECKING:
    from typing import Any

UTIL_STEP = 0.05

# The default order of candidates per situation; an engine's profile may give its own
# (`advice:` in rules/engines/<engine>.yaml, same keys). `note` adds to a step's why; `above`
# only lowers a utilisation that is above it.
DEFAULT_STEPS: dict[str, list[dict[str, Any]]] = {
    "oom.startup.graphs": [
        {"param": "gpu_memory_utilization", "note": "for CUDA-graph buffers"},
        {"param": "enforce_eager"},
        {"param": "cuda_graph_max_bs"},
    ],
    "oom.startup.profiling": [
        {"param": "limit_mm_per_prompt"},
        {"param": "max_num_seqs"},
        {"param": "max_num_batched_tokens"},
        {"param": "gpu_memory_utilization"},
    ],
    "oom.startup": [
        {"param": "gpu_memory_utilization"},
        {"param": "max_num_seqs"},
        {"param": "enforce_eager"},
    ],
    "oom.runtime": [
        {
            "param": "gpu_memory_utilization",
            "above": 0.9,
            "note": "for the activations of concurrent requests",
        },
        {"param": "max_num_batched_tokens"},
        {"param": "max_num_seqs"},
        {"param": "env:PYTORCH_CUDA_ALLOC_CONF"},
    ],
}
UTIL_MAX = 0.95
INTERNAL_PORT_FRAMES = {
    "get_open_port",
    "_create_c10d_store",
    "TCPStore",
    "init_process_group",
    "_init_process_group",
    "rendezvous",
    "init_distributed_environment",
    "_tcp_rendezvous_handler",
}
GRAPH_FRAMES = {"capture_model", "capture", "init_cuda_graphs", "CudaGraphRunner", "cuda_graph_runner"}

VERIFY = TAXONOMY.verify  # the check that a change worked, per class (rules/taxonomy/taxonomy.yaml)


@record
class Context:
    finding: Finding
    engine: str
    launch: dict[str, Any]
    profiles: Profiles
    frames: set[str]
    observed: dict[str, Any]  # what the engine reported (KV tokens, running requests, usage)
    rule: Any = None
    device: dict[str, Any] | None = None  # the GPU snapshot (JSON form), when given
    shape: Any = None  # budget.ModelShape from --config, when given

    @property
    def visible_gpus(self) -> int | None:
        return self.device["count"] if self.device else None

    @property
    def idle_gpus(self) -> list[int]:
        if not self.device:
            return []
        return [g["index"] for g in self.device["gpus"] if (g.get("memory_used_mib") or 0) <= 1024]

    def current(self, param: str) -> Any:
        """The value in force: launched with, said by the error, reported, else the default."""
        return value_in_force(
            param, self.launch, self.profiles, self.engine, self.finding.facts, self.observed
        )


def weight_gib_at(shape: Any, tp: int) -> float:
    from .budget import GIB, weight_bytes

    return weight_bytes(shape) / tp / GIB


def fmt_util(x: float) -> str:
    return f"{x:.2f}"


def util_down(x: float) -> float:
    """The next 0.05 step strictly below x."""
    return round(math.floor((x - 1e-9) / UTIL_STEP) * UTIL_STEP, 2)


def util_up(x: float) -> float | None:
    up = round(math.floor(x / UTIL_STEP + 1 + 1e-9) * UTIL_STEP, 2)
    return up if up <= UTIL_MAX and up > x else None


def len_down(n: int) -> int:
    """A context length at or below n: a round one (2^k or 3·2^k) within 10 %, else n on a 1024 grid."""
    if n < 1024:
        return max(256, n // 256 * 256)
    round_lens = sorted({m * 2**k for k in range(10, 25) for m in (1, 3)})
    best = max((x for x in round_lens if x <= n), default=0)
    if best >= 0.9 * n:
        return best
    return n // 1024 * 1024


def len_up(n: int) -> int:
    """The smallest round context length (2^k or 3·2^k, at least 1024) at or above n."""
    return min(x for x in (m * 2**k for k in range(10, 26) for m in (1, 3)) if x >= n)


def power_of_two_at_most(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


def divisors_at_most(n: int, cap: int) -> list[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]


def _as_float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def as_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


class Advisor:
    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.out: list[Change] = []
        self.complete = False  # the class logic knows better than the rule's generic list
        self._note: str | None = None  # the engine table's word on the step being added

    def add(self, param: str, to: Any, why: str, frm: Any = None, flag: str | None = None) -> None:
        if to is None or any(c.param == param for c in self.out):
            return
        if self._note:
            why = f"{why}; {self._note}" if self._note[0].isupper() else f"{why} {self._note}"
        f = self.ctx.finding
        fl = flag or flag_for(self.ctx.profiles, self.ctx.engine, param)
        to_s = to if isinstance(to, str) else (fmt_util(to) if isinstance(to, float) else str(to))
        if param.startswith("env:"):
            fl = f"{param[4:]}={to_s}"
        elif param == "shm_size":
            fl = f"--shm-size {to_s}"
        elif fl.startswith("env:"):
            fl = f"{fl[4:]}={to_s}"
        frm_s = None if frm is None else (fmt_util(frm) if isinstance(frm, float) else str(frm))
        self.out.append(
            Change(
                param=param,
                flag=fl,
                frm=frm_s,
                to=to_s,
                why=why,
                verify=VERIFY.get(f.cls, VERIFY["unknown_error"]),
            )
        )

    # --- parameters -------------------------------------------------------------------

    def util_lower(self, why_extra: str = "") -> None:
        f = self.ctx.finding
        cur = _as_float(self.ctx.current("gpu_memory_utilization")) or 0.9
        to = min(util_down(cur), UTIL_MAX)
        other, total = _as_float(f.facts.get("other_gib")), _as_float(f.facts.get("total_gib"))
        if other and total and other < total:
            # another process holds `other` GiB: only a budget within what is left can start
            to = min(to, math.floor((total - other) / total / UTIL_STEP) * UTIL_STEP)
        if to <= 0.3:
            return  # the GPU is taken or nearly so: a smaller budget is no fix
        self.add(
            "gpu_memory_utilization",
            to,
            f"leaves {round((cur - to) * 100)} % more of the GPU outside the engine's budget{why_extra}"
            + self.unit("gpu_memory_utilization"),
            cur,
        )

    def util_raise(self, why: str) -> bool:
        cur = _as_float(self.ctx.current("gpu_memory_utilization")) or 0.9
        to = util_up(cur)
        if to is None:
            return False
        self.add("gpu_memory_utilization", to, why + self.unit("gpu_memory_utilization"), cur)
        return True

    def unit(self, param: str) -> str:
        """What the value means on this engine, when it is not vLLM's share of total memory."""
        u = self.ctx.profiles.get(self.ctx.engine).units.get(param)
        return f" (here the value is {u})" if u else ""

    def halve(self, param: str, default: int, why: str, floor: int = 1) -> None:
        cur = as_int(self.ctx.current(param)) or default
        to = max(floor, cur // 2)
        if to < cur:
            self.add(param, to, why, cur)

    def tp_valid(self, want_more: bool) -> None:
        f = self.ctx.finding
        known = (
            self.ctx.current("tensor_parallel_size") if "tensor_parallel_size" in self.ctx.launch else None
        )
        cur = as_int(known) or 1
        if known is None and f.ranks:
            cur = max(cur, max(f.ranks) + 1)  # the log ran this many workers at least
            known = cur
        gpus = (
            as_int(f.facts.get("gpus") or f.facts.get("gpus2") or f.facts.get("gpus3"))
            or self.ctx.visible_gpus
        )
        heads = as_int(f.facts.get("heads") or f.facts.get("numerator"))
        denom = as_int(f.facts.get("tensor_parallel_size") or f.facts.get("denominator"))
        if denom:
            cur, known = denom, denom
        if want_more:
            to = cur * 2
            if gpus is not None and to > gpus:
                return
            self.add(
                "tensor_parallel_size",
                to,
                f"splits the weights over {to} GPUs instead of {cur}, halving what each must hold",
                cur,
            )
            return
        if known is None and gpus is None and not heads:
            self.add(
                "tensor_parallel_size",
                "a divisor of the model's (KV) heads",
                "the log shows neither the size used nor the head count; config.json has "
                "num_attention_heads and num_key_value_heads",
            )
            return
        cap = gpus if gpus is not None else max(1, cur - 1)
        if heads:
            options = divisors_at_most(heads, cap)
            to = options[-1] if options else 1
            why = f"{heads} heads split evenly over {to} ranks" + (
                f" and {gpus} GPUs are visible" if gpus else ""
            )
        else:
            to = power_of_two_at_most(cap)
            why = (
                f"only {gpus} GPUs are visible"
                if gpus is not None
                else f"{cur} does not fit; a power of two divides the heads of nearly every model"
            )
        if to == cur:
            return
        self.add("tensor_parallel_size", to, why, cur)

    # --- per class ----------------------------------------------------------------------

    def run(self) -> list[Change]:
        f = self.ctx.finding
        rule = self.ctx.rule
        # a rule that names values knows this message better than the class's defaults
        specific = rule is not None and any("to" in a for a in rule.advice)
        if specific:
            self.from_rule()
        setting = f.facts.get("setting")
        if setting and f.confidence in ("medium", "low"):
            self.generic(str(setting))  # the launch setting the engine's own message names
        handler = getattr(self, "for_" + f.cls, None)
        if handler is not None:
            handler()
        if not self.complete and not specific:
            self.from_rule()
        return self.out

    def from_rule(self) -> None:
        """The rule's own suggestions, for anything the class logic did not cover."""
        rule = self.ctx.rule
        for a in rule.advice if rule is not None else []:
            param = a["param"]
            to = a.get("to")
            if to is not None:
                try:
                    to = fill_template(str(to), self.ctx.finding.facts)
                    why = fill_template(str(a.get("why") or rule.title), self.ctx.finding.facts)
                except (KeyError, ValueError):
                    continue  # the line did not carry that number: the next candidate says more
                self.add(param, to, why, self.ctx.current(param))
            else:
                before = len(self.out)
                self.generic(param)
                if a.get("why") and len(self.out) > before and self.out[-1].param == param:
                    # the rule knows why this change helps here better than the class does
                    self.out[-1].why = _filled(str(a["why"]), self.ctx.finding.facts) or self.out[-1].why

    def generic(self, param: str) -> None:
        f = self.ctx.finding
        if param == "gpu_memory_utilization":
            if f.cls in ("kv_cache_too_small",):
                self.util_raise("gives the KV cache more of each GPU")
            else:
                self.util_lower()
        elif param == "tensor_parallel_size":
            self.tp_valid(want_more=f.cls in ("oom", "kv_cache_too_small", "preemption"))
        elif param == "pipeline_parallel_size":
            cur = as_int(self.ctx.current("pipeline_parallel_size")) or 1
            if f.cls == "tp_mismatch" and cur > 1:
                self.add(
                    param, 1, "this model cannot be split into pipeline stages; use tensor parallelism", cur
                )
            elif f.cls != "tp_mismatch":
                self.add(param, cur * 2, f"splits the layers over {cur * 2} stages (GPUs or nodes)", cur)
        elif param == "dtype":
            cur = str(self.ctx.current("dtype") or "auto")
            if "bfloat16" in cur or "bf16" in cur or cur == "auto":
                self.add(
                    param,
                    "half",
                    "float16 runs on every CUDA GPU; bfloat16 needs compute capability 8.0",
                    cur,
                )
        elif param == "gpu_layers":
            on_gpu = as_int(self.ctx.observed.get("gpu_layers_offloaded"))
            if on_gpu:
                self.add(
                    param,
                    max(0, on_gpu * 3 // 4),
                    f"{on_gpu} layers were on the GPU; a quarter fewer leave room",
                    on_gpu,
                )
            else:
                self.add(
                    param,
                    "fewer than now (the log's 'offloaded N/M layers to GPU' line says how many)",
                    "the layers placed on the GPU did not fit; the rest run on the CPU",
                )
        elif param == "max_num_seqs":
            self.halve(
                "max_num_seqs",
                256,
                "fewer concurrent sequences need fewer KV blocks and less activation memory",
            )
        elif param == "max_num_batched_tokens":
            self.halve(
                "max_num_batched_tokens",
                as_int(f.facts.get("prefill_tokens")) or 8192,
                "smaller prefill chunks lower the activation peak",
                512,
            )
        elif param == "cuda_graph_max_bs":
            self.halve("cuda_graph_max_bs", 160, "smaller captured batches need less graph memory", 8)
        elif param == "kv_cache_dtype":
            if str(self.ctx.current("kv_cache_dtype") or "auto").startswith("fp8"):
                return
            self.add(
                "kv_cache_dtype",
                "fp8",
                "an fp8 KV cache holds twice the tokens in the same memory",
                self.ctx.current("kv_cache_dtype"),
            )
        elif param == "enforce_eager":
            self.add(
                "enforce_eager", "true", "skips CUDA-graph capture and its memory (slower decoding)", "false"
            )
        elif param == "quantization":
            ckpt = f.facts.get("checkpoint_quantization")
            if ckpt:
                self.add(
                    "quantization",
                    str(ckpt),
                    f"the checkpoint was quantized with {ckpt}; "
                    "the flag must name the same method (or be left out)",
                    self.ctx.current("quantization"),
                )
                return
            self.add(
                "quantization",
                "fp8",
                "fp8 weights need half the memory of bf16 (Ada/Hopper GPUs or newer)",
                self.ctx.current("quantization"),
            )
        elif param == "max_model_len":
            cur = as_int(self.ctx.current("max_model_len"))
            if cur:
                self.add(
                    "max_model_len",
                    len_down(cur // 2),
                    "halves the longest sequence the KV cache must hold",
                    cur,
                )
        elif param == "port":
            self.port()
        elif param in ("nccl_port", "master_port"):
            self.add(param, "a free port", "an internal rendezvous port collides with another process")
        elif param == "shm_size":
            self.add(
                "shm_size",
                "16g",
                "NCCL needs more /dev/shm than a container's 64 MB default (or run with --ipc=host)",
            )
        elif param == "env:NCCL_DEBUG":
            self.add(param, "INFO", "NCCL then logs which transport and peer fail")
        elif param == "env:NCCL_P2P_DISABLE":
            self.add(param, "1", "peer-to-peer over PCIe is a frequent cause of NCCL errors and hangs")
        elif param == "env:NCCL_SHM_DISABLE":
            self.add(
                param, "1", "falls back from the /dev/shm transport when shared memory cannot be enlarged"
            )
        elif param == "env:CUDA_VISIBLE_DEVICES":
            idle = self.ctx.idle_gpus
            if idle:
                self.add(param, ",".join(str(i) for i in idle), "the snapshot shows these GPUs idle")
            else:
                self.add(
                    param,
                    "<idle GPU ids>",
                    "start the server on GPUs no other process uses (check `nvidia-smi`)",
                )
        elif param == "action:free_gpu":
            self.free_gpu()
        elif param == "action:free_port":
            port = f.facts.get("port")
            self.add(
                param,
                f"stop the process holding port {port}" if port else "stop leftover server/worker processes",
                "a previous instance (or its workers) still holds the port",
            )
        elif param == "action:reinstall":
            self.add(
                param,
                "reinstall the engine and its CUDA extensions for the installed torch",
                "a compiled package does not match the environment",
            )
        elif param == "action:expose_gpu":
            self.add(
                param,
                "run with --gpus all (Docker) / the NVIDIA runtime, and check `nvidia-smi` inside",
                "the process cannot see any GPU",
            )
        elif param == "engine_version":
            self.add(
                param,
                "a release that supports this model",
                "the installed engine does not know this architecture or build",
            )
        elif param == "trust_remote_code":
            self.add(
                param,
                "true",
                "the checkpoint ships its own code; read it first, it runs on your machine",
                "false",
            )
        elif param == "model":
            self.add(
                param,
                "re-download the checkpoint (verify file sizes/hashes)",
                "a shard is missing or corrupt",
            )
        elif param == "max_tokens":
            self.add(
                param,
                "lower it in the request (prompt + max_tokens ≤ max_model_len)",
                "the request asks for more tokens than the context holds",
            )
        elif param == "schedule_conservativeness":
            self.add(
                param, 1.3, "admits fewer new requests while the pool is near full", self.ctx.current(param)
            )
        elif param.startswith("env:"):
            self.add(param, "1", f"see `diagnose rules show {f.rule}`")

    def port(self) -> None:
        f = self.ctx.finding
        port = as_int(f.facts.get("port")) or as_int(self.ctx.current("port"))
        if port is None:
            return
        new = free_port(port + 1)
        holder = f.facts.get("holder_pid")
        who = ""
        if holder:
            name = f.facts.get("holder_name")
            who = f" by pid {holder}" + (f" ({name})" if name else "")
        else:
            here = port_holder(port)  # when the check runs where the server ran
            if here is not None:
                who = f"; on this host pid {here[0]} listens on it ({here[1][:60]})"
        self.add(
            "port",
            new if new is not None else port + 1,
            f"port {port} is taken{who}" + (f"; {new} is free on this host now" if new else ""),
            port,
        )

    def free_gpu(self) -> None:
        f = self.ctx.finding
        pid, gib = f.facts.get("other_pid"), f.facts.get("other_gib")
        free, total = f.facts.get("free_gib"), f.facts.get("total_gib")
        if pid and gib and f.facts.get("self_listed"):
            why = f"process {pid} holds {gib} GiB on GPU {f.facts.get('gpu', '?')}"
        elif f.cls == "gpu_busy" and free is not None and total:
            why = f"only {free} of {total} GiB are free: another process holds the rest"
        elif free is not None and total:
            own, tot, fr = _as_float(f.facts.get("process_gib")), _as_float(total), _as_float(free)
            if own is not None and tot and fr is not None and tot - fr - own < max(0.5, 0.02 * tot):
                return  # the failing process itself holds what is used: nobody else to stop
            why = f"only {free} of {total} GiB were free; make sure no other process shares this GPU"
        else:
            why = "another process holds memory on this GPU"
        self.add("action:free_gpu", "stop the other process on the GPU (see `nvidia-smi`)", why)

    def seqs_that_fit(self, dry: bool = False) -> int | None:
        """max_num_seqs from what the KV cache held at the last stats line: running ÷ usage."""
        obs = self.ctx.observed
        facts = self.ctx.finding.facts  # a serving verdict carries the stats line it stands on
        running = as_int(facts.get("running") if "running" in facts else obs.get("running"))
        usage = _as_float(facts.get("kv_usage") if "kv_usage" in facts else obs.get("kv_usage"))
        if usage is None and obs.get("kv_usage_pct") is not None:
            usage = (_as_float(obs["kv_usage_pct"]) or 0) / 100
        if not running or not usage or usage < 0.5:
            return None
        fit = int(running * 0.9 / usage)  # sequences of today's typical length at 90 % usage
        # the cap in force when the log says it; a default is no "was" (SGLang computes its own)
        known = (
            "max_num_seqs" in self.ctx.launch
            or "max_num_seqs" in obs
            or "max_num_seqs" in self.ctx.profiles.get(self.ctx.engine).defaults
        )
        cur = as_int(self.ctx.current("max_num_seqs")) if known else None
        if fit < 1 or (cur is not None and fit >= cur):
            return None
        if dry:
            return fit
        tokens = obs.get("kv_tokens")
        per = f" (~{int(usage * tokens / running)} tokens each)" if tokens else ""
        self.add(
            "max_num_seqs",
            fit,
            f"{running} running requests{per} filled {usage:.0%} of the KV cache; {fit} leave 10 % headroom",
            cur,
        )
        return fit

    def tp_from_budget(self) -> None:
        """With config.json: the smallest tensor-parallel size whose weights fit, else fp8 weights."""
        s = self.ctx.shape
        total = _as_float(self.ctx.finding.facts.get("total_gib"))
        if s is None or total is None:
            return
        from .budget import engine_units, plan

        engine = self.ctx.engine if self.ctx.engine in self.ctx.profiles.by_engine else "vllm"
        units = engine_units(engine, self.ctx.profiles)
        if units.kv_budget == "layers":
            return  # layer-offload engines have no parallel size: their advice is GPU layers
        gpus = self.ctx.visible_gpus or 8
        cur = as_int(self.ctx.current("tensor_parallel_size")) or 1
        util = _as_float(self.ctx.current("gpu_memory_utilization"))  # in the engine's own units
        p = plan(
            s,
            gpus,
            total,
            util=util,
            max_model_len=as_int(self.ctx.current("max_model_len")) or 4096,
            units=units,
        )
        if p.fits and p.tp <= cur:
            # the arithmetic says it fits as launched: the memory went elsewhere
            self.add(
                "action:free_gpu",
                "stop whatever else uses the GPU (see `nvidia-smi`)",
                f"config.json: the weights need only {weight_gib_at(s, cur):.1f} GiB per GPU at "
                f"tensor_parallel_size {cur}, which fits {total:g} GiB; something else held the memory",
            )
        elif p.fits:
            self.add(
                "tensor_parallel_size",
                p.tp,
                f"config.json: the weights take {p.weights_gib_per_gpu:.1f} GiB "
                f"per GPU at {p.tp} GPUs of {total:g} GiB (and {s.heads} heads divide evenly)",
                cur,
            )
        elif not p.fits:
            self.add(
                "quantization",
                "fp8",
                f"config.json: no parallel size on {gpus} GPUs of {total:g} GiB holds "
                f"{s.params_total / 1e9:.1f} B parameters in {s.dtype_bytes:g}-byte weights",
                self.ctx.current("quantization"),
            )

    def for_kv_cache_too_small(self) -> None:
        f = self.ctx.finding
        est = as_int(f.facts.get("est_max_len") or f.facts.get("kv_tokens"))
        cur = as_int(f.facts.get("max_model_len")) or as_int(self.ctx.current("max_model_len"))
        need, avail = _as_float(f.facts.get("needed_gib")), _as_float(f.facts.get("available_gib"))
        if not est and cur and need and avail and avail > 0:
            est = int(cur * avail / need)  # KV memory grows linearly with the length
        if est and (cur is None or est < cur):
            to = len_down(est)
            self.add("max_model_len", to, f"the KV cache holds about {est} tokens; {cur} does not fit", cur)
        frac = _as_float(f.facts.get("min_fraction"))
        if frac:
            to = min(UTIL_MAX, math.ceil((frac + 0.01) / 0.01) * 0.01)
            self.add(
                "gpu_memory_utilization",
                round(to, 2),
                f"the log says the minimum viable fraction is {frac}",
                _as_float(f.facts.get("mem_fraction_static2")),
            )
        if f.facts.get("max_total_tokens"):  # TGI names the total tokens one request may take
            n = as_int(f.facts["max_total_tokens"]) or 0
            self.add(
                "max_model_len", len_down(n // 2), f"{n} total tokens per request do not fit the KV blocks", n
            )
        self.util_raise("gives the KV cache more of each GPU")
        self.generic("kv_cache_dtype")
        self.tp_valid(want_more=True)

    def has(self, param: str) -> bool:
        """Does the detected engine have this setting at all (its profile spells it)?"""
        return param in self.ctx.profiles.get(self.ctx.engine).flags

    def weights_fill_budget(self) -> str | None:
        """The weights alone take (nearly) all the memory the engine may use: why, or None."""
        f = self.ctx.finding
        weights = _as_float(self.ctx.observed.get("weights_gib"))
        total = _as_float(f.facts.get("total_gib") or self.ctx.observed.get("gpu_total_gib"))
        util = _as_float(self.ctx.current("gpu_memory_utilization")) or 0.9
        if weights and total and weights >= 0.8 * util * total:
            return (
                f"the weights take {weights:g} GiB of the {util * total:.1f} GiB the engine may use "
                f"({util:g} × {total:g} GiB): nothing is left to profile or cache"
            )
        return None

    def for_oom_layered(self) -> None:
        """Engines that place layers on the GPU (llama.cpp, Ollama): the weights' share is the
        layer count, the KV cache and compute buffers follow the context size."""
        f = self.ctx.finding
        obs = self.ctx.observed
        on_gpu = as_int(obs.get("gpu_layers_offloaded")) or as_int(self.ctx.current("gpu_layers"))
        layers = as_int(obs.get("gpu_layers_total"))
        ctx_now = (
            as_int(obs.get("n_ctx"))
            or as_int(obs.get("n_ctx_per_seq"))  # one slot: the whole context
            or as_int(self.ctx.current("max_model_len"))
        )

        def fewer_layers() -> None:
            if on_gpu:
                to = max(0, on_gpu * 3 // 4)
                of = f" of {layers}" if layers else ""
                self.add(
                    "gpu_layers",
                    to,
                    f"{on_gpu}{of} layers were placed on the GPU; about a quarter fewer leave room "
                    "(the rest run on the CPU, slower)",
                    on_gpu,
                )
            else:
                self.add(
                    "gpu_layers",
                    "fewer than now (the log's 'offloaded N/M layers to GPU' line says how many)",
                    "the layers placed on the GPU did not fit; the rest run on the CPU",
                )

        def shorter_context() -> None:
            if ctx_now:
                self.add(
                    "max_model_len",
                    len_down(ctx_now // 2),
                    f"the KV cache and compute buffers grow with the context ({ctx_now} tokens); half needs half",
                    ctx_now,
                )
            else:
                self.add(
                    "max_model_len",
                    "half the context now in use (the 'n_ctx' line shows it)",
                    "the KV cache and compute buffers grow with the context",
                )

        if f.oom_phase == "load":
            fewer_layers()
            self.generic("model")
            return
        shorter_context()
        if f.oom_phase == "startup" and "compute" in f.rule:
            self.halve("max_num_batched_tokens", 512, "the compute buffer grows with the micro-batch", 64)
        if self.has("kv_cache_dtype") and str(self.ctx.current("kv_cache_dtype") or "f16") in ("f16", "auto"):
            self.add("kv_cache_dtype", "q8_0", "a q8_0 KV cache takes half the memory of f16", "f16")
        fewer_layers()

    def for_oom(self) -> None:
        f = self.ctx.finding
        other = f.facts.get("other_pid") and f.facts.get("self_listed")
        if self.has("gpu_layers"):
            self.for_oom_layered()
            return
        if f.oom_phase == "load":
            if other:
                self.free_gpu()
                self.generic("env:CUDA_VISIBLE_DEVICES")
            tp = as_int(self.ctx.current("tensor_parallel_size")) or 1
            total = _as_float(f.facts.get("total_gib"))
            gpus = self.ctx.visible_gpus
            one_card = gpus == 1 or (gpus is None and tp == 1 and total is not None and total <= 32)
            if one_card:
                # one consumer card: there is no second GPU to split over; fewer bytes per weight is the way
                self.generic("quantization")
                self.add(
                    "model",
                    "a smaller or pre-quantised checkpoint (AWQ/GPTQ int4)",
                    f"the weights do not fit one {total:g} GiB GPU"
                    if total
                    else "the weights do not fit one GPU",
                )
                if self.has("cpu_offload_gb"):
                    self.add(
                        "cpu_offload_gb",
                        max(2, int(total // 4)) if total else 4,
                        "keeps part of the weights in CPU memory (slower, but it loads)",
                        self.ctx.current("cpu_offload_gb"),
                    )
            self.tp_from_budget()
            self.tp_valid(want_more=True)
            self.generic("quantization")
            self.free_gpu()
            # the weights did not fit: a smaller KV budget or fewer sequences cannot help
            self.complete = True
            return
        if f.oom_phase == "startup":
            full = self.weights_fill_budget()
            if full:
                self.generic("quantization")
                self.add("model", "a smaller or pre-quantised checkpoint (AWQ/GPTQ int4)", full)
        if f.oom_phase == "startup":
            if other:
                self.free_gpu()
            graphs = f.phase_at == "cuda_graphs" or bool(self.ctx.frames & GRAPH_FRAMES) or "graph" in f.rule
            profiling = f.phase_at in (None, "weights_loaded", "load_weights") or bool(
                self.ctx.frames
                & {"profile_run", "_dummy_run", "_dummy_sampler_run", "determine_num_available_blocks"}
            )
            sub = "graphs" if graphs else "profiling" if profiling else ""
            self.apply_steps("oom.startup", sub)
            return
        # runtime: fragmentation first, whatever the engine
        uptime = _as_float(f.facts.get("uptime_s")) or 0.0
        if uptime >= 3600:
            self.add(
                "env:PYTORCH_CUDA_ALLOC_CONF",
                "expandable_segments:True",
                f"the server ran {uptime / 3600:.1f} h before this OOM: fragmentation, not the load, is the usual cause",
            )
        reserved = _as_float(f.facts.get("reserved_unallocated_gib")) or 0.0
        total = _as_float(f.facts.get("total_gib")) or 0.0
        if reserved >= 1.0 or (total and reserved >= 0.05 * total):
            self.add(
                "env:PYTORCH_CUDA_ALLOC_CONF",
                "expandable_segments:True",
                f"{reserved} GiB are reserved but unallocated: the memory is fragmented",
            )
        self.apply_steps("oom.runtime", "")

    def steps(self, key: str, sub: str) -> list[dict[str, Any]]:
        """The ordered candidates for this situation: the engine's own table (its profile's
        `advice`, most specific key first), else the default one."""
        own = self.ctx.profiles.get(self.ctx.engine).advice
        for k in ([f"{key}.{sub}"] if sub else []) + [key]:
            if k in own:
                return own[k]
        return DEFAULT_STEPS.get(f"{key}.{sub}") or DEFAULT_STEPS.get(key, [])

    def apply_steps(self, key: str, sub: str) -> None:
        for step in self.steps(key, sub):
            param, note = step["param"], step.get("note")
            if param == "gpu_memory_utilization":
                above = _as_float(step.get("above"))
                cur = _as_float(self.ctx.current(param)) or 0.9
                if above is None or cur > above:
                    self.util_lower(f" {note}" if note else "")
            elif param == "limit_mm_per_prompt":
                if "limit_mm_per_prompt" in self.ctx.launch:
                    self.add(
                        "limit_mm_per_prompt",
                        "fewer images/videos per prompt",
                        "the profiling pass builds a dummy batch with the maximum multimodal inputs",
                        self.ctx.launch["limit_mm_per_prompt"],
                    )
            elif param == "env:PYTORCH_CUDA_ALLOC_CONF":
                self.add(
                    param,
                    "expandable_segments:True",
                    "reduces fragmentation, the usual cause of OOMs after hours of serving",
                )
            else:
                self._note = note
                try:
                    self.generic(param)
                finally:
                    self._note = None

    def for_request(self) -> None:
        """A request too long: when the prompt alone exceeds the context, only a longer
        context helps (up to what the model allows); otherwise ask for fewer new tokens."""
        f = self.ctx.finding
        limit = as_int(f.facts.get("max_model_len") or f.facts.get("max_model_len2"))
        prompt = as_int(
            f.facts.get("input_tokens")
            or f.facts.get("input_tokens2")
            or f.facts.get("prompt_tokens")
            or f.facts.get("prompt_tokens2")
            or f.facts.get("requested_tokens")
        )
        if limit and prompt and prompt >= limit and self.has("max_model_len"):
            model_max = as_int(self.ctx.observed.get("model_max_len"))
            want = len_up(int(prompt * 1.25))
            cap = (
                f" (the model allows {model_max})"
                if model_max
                else " if the model's max_position_embeddings allows it"
            )
            to = min(want, model_max) if model_max else want
            if to > limit:
                self.add(
                    "max_model_len",
                    to,
                    f"the prompt alone has {prompt} tokens, over the {limit}-token context: only a longer "
                    f"context serves it, with room for the answer{cap}",
                    limit,
                )
                self.complete = True  # fewer new tokens cannot help a prompt that alone is too long
                return
        if prompt and limit and prompt < limit:
            self.add(
                "max_tokens",
                limit - prompt,
                f"the prompt has {prompt} tokens; {limit - prompt} new tokens fit the {limit}-token context",
            )
            self.complete = True

    def for_gpu_busy(self) -> None:
        f = self.ctx.finding
        self.free_gpu()
        self.generic("env:CUDA_VISIBLE_DEVICES")
        free, total = _as_float(f.facts.get("free_gib")), _as_float(f.facts.get("total_gib"))
        if free is not None and total:
            to = math.floor(free / total / UTIL_STEP) * UTIL_STEP
            if to >= 0.3:
                self.add(
                    "gpu_memory_utilization",
                    round(min(to, UTIL_MAX), 2),
                    f"fits in the {free} of {total} GiB that are free",
                    self.ctx.current("gpu_memory_utilization"),
                )

    def for_preemption(self) -> None:
        fit = self.seqs_that_fit(dry=True)
        if fit is not None and fit < 8:
            # a handful of very long sequences: capping concurrency would starve the server
            self.util_raise("more KV cache means fewer preemptions")
        self.seqs_that_fit()
        self.generic("max_num_seqs")
        self.util_raise("more KV cache means fewer preemptions")
        self.generic("kv_cache_dtype")

    def for_tp_mismatch(self) -> None:
        self.tp_valid(want_more=False)

    def for_nccl(self) -> None:
        f = self.ctx.finding
        if "segment" in f.facts or "/dev/shm" in f.evidence:
            self.generic("shm_size")
        self.generic("env:NCCL_DEBUG")
        self.generic("env:NCCL_P2P_DISABLE")

    def for_port_in_use(self) -> None:
        f = self.ctx.finding
        # torch's TCPStore and vLLM's get_open_port bind internal rendezvous ports; the API
        # server binds --port (uvicorn, or vLLM's create_server_socket)
        named = str(f.facts.get("port_name") or "")
        if named and named != "port":
            # SGLang names the internal port it waited for (nccl_port, dist_init_port, …)
            port = as_int(f.facts.get("port")) or 0
            new = free_port(port + 1) if port else None
            self.add(
                "nccl_port" if "nccl" in named else named,
                new if new is not None else "a free port",
                f"SGLang's {named} {port} is held by another process",
                port or None,
            )
            self.generic("action:free_port")
            self.complete = True
            return
        internal = f.facts.get("port") is None and (
            bool(self.ctx.frames & INTERNAL_PORT_FRAMES)
            or "server socket has failed to listen" in f.evidence
            or "TCPStore" in f.evidence
        )
        if internal:
            self.generic("action:free_port")
            new = free_port(29600)
            param = "nccl_port" if self.has("nccl_port") else "master_port"
            self.add(
                param,
                new if new is not None else "a free port",
                "an internal rendezvous port collides with a leftover process; pin it to a free one",
            )
            self.complete = True
            return
        self.port()
        self.generic("action:free_port")

    def for_config(self) -> None:
        """The engine refused a launch setting: change the one its message names (a canonical
        parameter, or the flag itself in the engine's own name)."""
        f = self.ctx.finding
        if self.out:
            return
        setting, flag = f.facts.get("setting"), None
        if not setting:
            m = re.search(r"(?<![\w-])--([a-z][a-z0-9]*(?:[-_][a-z0-9]+)+|[a-z]{3,})\b", f.evidence)
            if m is None:
                return
            setting, flag = m.group(1).replace("-", "_"), "--" + m.group(1)
        self.add(
            str(setting),
            "the value the message asks for (or leave it unset)",
            f"the engine refused it: {f.evidence[:160]}",
            self.ctx.current(str(setting)),
            flag=flag,
        )
        if flag and self.out:
            self.out[-1].named_by_engine = True

    def for_hang(self) -> None:
        """What a stuck phase usually waits on (the seed's "stuck at one line" checklist)."""
        if self.ctx.rule is not None:
            return  # an engine's own timeout message: its rule knows the knob
        phase = self.ctx.finding.facts.get("phase") or self.ctx.finding.phase_at
        ranks = as_int(self.ctx.current("tensor_parallel_size")) or 1
        if phase in ("distributed_init", None) or (ranks > 1 and phase in ("load_weights", "weights_loaded")):
            # with several ranks a stall before the weights are in is most often a rank that never joined
            self.generic("env:NCCL_DEBUG")
            self.generic("env:NCCL_P2P_DISABLE")
            self.generic("shm_size")
        elif phase == "load_weights":
            self.add(
                "model",
                "a local path to the downloaded checkpoint",
                "weight download or verification is stuck: fetch it first (huggingface-cli download) and "
                "check disk throughput",
                self.ctx.current("model"),
            )
            self.add("env:HF_HUB_OFFLINE", "1", "no Hub round-trips once the files are local")
        elif phase in ("weights_loaded", "kv_cache"):
            self.add(
                "enforce_eager",
                "true",
                "skips torch.compile and graph capture, the usual long waits here "
                "(or make sure the compile cache directory is writable)",
                "false",
            )
        elif phase == "cuda_graphs":
            self.generic("enforce_eager")
            self.generic("action:free_gpu")
        elif phase == "listening":
            self.add(
                "env:NO_PROXY",
                "localhost,127.0.0.1",
                "the warm-up request to itself is not coming back; an HTTP proxy often intercepts localhost",
            )
        elif phase in ("start", "args"):
            # resolving the model: config, tokenizer and file lists come from the Hub
            self.add(
                "env:HF_HUB_OFFLINE",
                "1",
                "resolving the model's files on the Hub (config, tokenizer, file list) is the usual wait "
                "here; download once (huggingface-cli download) and start offline",
            )
            self.add(
                "model",
                "a local path to the downloaded checkpoint",
                "a local directory needs no Hub round-trip at all",
                self.ctx.current("model"),
            )
        elif phase == "devices":
            self.generic("action:expose_gpu")


def advise(
    finding: Finding | None,
    engine: str,
    launch: dict[str, Any],
    profiles: Profiles,
    rule: Any = None,
    frames: set[str] | None = None,
    observed: dict[str, Any] | None = None,
    device: dict[str, Any] | None = None,
    shape: Any = None,
) -> list[Change]:
    if finding is None:
        return []
    ctx = Context(
        finding=finding,
        engine=engine,
        launch=launch,
        profiles=profiles,
        frames=frames or set(),
        observed=observed or {},
        rule=rule,
        device=device,
        shape=shape,
    )
    return _fit_engine(Advisor(ctx).run(), engine, profiles)


# Changes that are not an engine setting: any engine can take them.
def _filled(template: str, facts: dict[str, Any]) -> str | None:
    """The template with the finding's facts, or None when the line did not carry them."""
    try:
        return fill_template(template, facts)
    except (KeyError, ValueError):
        return None


NOT_A_SETTING = ("model", "engine_version", "max_tokens", "shm_size")


def _fit_engine(changes: list[Change], engine: str, profiles: Profiles) -> list[Change]:
    """Only what the detected engine has, in its spelling. A log no engine claims is read with
    the generic profile (the seed guides' engine, a config file of a few keys): its own keys
    come first, the other changes follow under their canonical names, never another engine's
    flags."""
    flags = profiles.get(engine).flags

    def has(c: Change) -> bool:
        # a flag the engine's own message named (for_config) is the engine's by definition
        return (
            c.param in flags
            or c.param.startswith(("env:", "action:"))
            or c.param in NOT_A_SETTING
            or c.named_by_engine
        )

    if engine != "generic":
        return [c for c in changes if has(c)]
    for c in changes:
        if not has(c):
            c.flag = c.param  # the concept's name: no engine's flag is guessed
    return [c for c in changes if has(c)] + [c for c in changes if not has(c)]


# Phases where a log that simply stops is, far more often than not, a stall worth acting on.
STALL_PRONE = {"distributed_init"}


def advise_incomplete(
    last_phase: str | None,
    engine: str,
    launch: dict[str, Any],
    profiles: Profiles,
    observed: dict[str, Any] | None = None,
    stopped: bool = False,
) -> list[Change]:
    """A log that ends mid-startup with no error: what to try if it stays in that phase (or
    what it waited on, when someone stopped it there)."""
    observed = observed or {}
    # shards or ranks still waiting while others are up: the classic distributed stall
    waiting = (as_int(observed.get("shard_waiting_rank")) or 0) >= 1
    multi = (as_int(launch.get("tensor_parallel_size")) or 1) > 1 or waiting
    stalled = (
        stopped or last_phase in STALL_PRONE or (multi and last_phase in ("load_weights", "weights_loaded"))
    )
    if not stalled or (stopped and not last_phase):
        return []  # stopped before any phase: nothing it waited on to name
    stall = Finding(
        rule="generic.stall",
        cls="hang",
        severity="warning",
        title="",
        line=0,
        source="",
        evidence="",
        phase_at=last_phase,
        facts={"phase": "distributed_init" if waiting else last_phase},
    )
    changes = advise(stall, engine, launch, profiles, observed=observed)
    from .render import PHASE_LABEL

    label = (
        f"{PHASE_LABEL.get(last_phase, last_phase)} (where it was stopped)"
        if stopped
        else "distributed init"
        if last_phase == "distributed_init"
        else "startup with ranks still waiting"
    )
    for c in changes:
        c.why = f"if it stays in {label}: {c.why}"
    return changes
