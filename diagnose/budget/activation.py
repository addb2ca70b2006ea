"""What the engine subtracts before the KV cache: the profiling pass's activation peak (forward
and sampler), non-torch memory and CUDA graphs, by engine generation; the engine's defaults
for batched tokens and sequences.
"""

from __future__ import annotations

import re

from ..base.errors import InputError
from .shape import ModelShape
from .units import GIB, EngineUnits

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
