"""One candidate launch and its budget (`Plan`): the inputs, the figures per GPU, whether it fits
and why not; its JSON and the launch line for the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .kv import kv_bytes_per_token
from .shape import ModelShape
from .units import EngineUnits


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
    devices: tuple[int, ...] | None = None  # the GPUs it runs on (nvidia-smi's indices)
    launch_env: str = ""  # CUDA_VISIBLE_DEVICES=… when those are not the ones the engine would take
    proposals: list[Any] = field(default_factory=list)  # alternatives.Proposal, when it does not fit
    model_id: str | None = None  # what the launch line names the model by (else MODEL)
    quantization: str | None = None  # applied at load (--quantization), not the checkpoint's own

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
            "proposals": [pr.to_json() for pr in self.proposals],
            **({"devices": list(self.devices)} if self.devices is not None else {}),
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
        env = f"# in the server's environment: {p.launch_env.strip()}\n" if p.launch_env else ""
        return (
            f"{env}tensor_parallel_size: {p.tp}\ngpu_memory_utilization: {p.util:.2f}\n"
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
    if p.quantization and not layers:
        params.append(("quantization", p.quantization))
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
    model = p.model_id or "MODEL"
    if layers and not model.lower().endswith(".gguf"):
        model = "MODEL.gguf"  # these engines load a GGUF file, not a checkpoint directory
    head = p.launch_env + units.launch.format(model=model)
    if model_params:  # a Modelfile: the model's own parameters
        lines = [head, *model_params]
        if env:
            lines.append(f"# the server: {' '.join(env)}")
        return "\n".join(lines)
    return " ".join([*env, head, *args])
