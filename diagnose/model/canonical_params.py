"""The canonical parameter names advice may use (DESIGN.md), and which of them the advice
code can give a value to without the rule saying it. Checked when rules load: a rule that
advises a name outside this list, or a valueless one nothing can compute, is a load error."""

from __future__ import annotations

import re

# The engine settings DESIGN.md names (vLLM's names where vLLM has the concept): a launch
# dump keeps them (launch.CANONICAL adds what only the report shows) and advice may change them.
SETTINGS = frozenset(
    {
        "gpu_memory_utilization",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "kv_cache_dtype",
        "quantization",
        "enforce_eager",
        "cuda_graph_max_bs",
        "enable_chunked_prefill",
        "limit_mm_per_prompt",
        "port",
        "swap_space",
        "cpu_offload_gb",
        "dtype",
        "trust_remote_code",
        "attention_backend",
    }
)
# What advice may name: the settings, the engines' own concepts, and what is not a setting.
CANONICAL_PARAMS = SETTINGS | {
    "master_port",
    "nccl_port",
    "max_tokens",
    "shm_size",
    "engine_version",
    "model",
    "gpu_layers",
    "max_batch_total_tokens",
    "schedule_conservativeness",
    "disable_custom_all_reduce",
}
# Params the advice code gives a value to without the rule saying it (advice.Advisor.generic
# and the class logic); the others need a `to` in the rule.
NEEDS_A_VALUE = frozenset(
    {
        "data_parallel_size",
        "enable_chunked_prefill",
        "limit_mm_per_prompt",
        "swap_space",
        "cpu_offload_gb",
        "attention_backend",
        "max_batch_total_tokens",
        "disable_custom_all_reduce",
    }
)
COMPUTED_PARAMS = (CANONICAL_PARAMS - NEEDS_A_VALUE) | {
    "env:NCCL_DEBUG",
    "env:NCCL_P2P_DISABLE",
    "env:NCCL_SHM_DISABLE",
    "env:CUDA_VISIBLE_DEVICES",
    "action:free_gpu",
    "action:free_port",
    "action:reinstall",
    "action:expose_gpu",
}
ACTIONS = frozenset({"action:free_gpu", "action:free_port", "action:reinstall", "action:expose_gpu"})
_ENV_RE = re.compile(r"^env:[A-Z][A-Z0-9_]*$")
# {group} or {group*3} / {group/2}: a named group of the rule's pattern, maybe scaled
TEMPLATE_RE = re.compile(r"\{(?P<name>\w+)(?:(?P<op>[*/])(?P<k>\d+(?:\.\d+)?))?\}")


def param_problem(param: str, has_value: bool) -> str | None:
    """Why a rule may not advise this param (None when it may)."""
    if param.startswith("env:"):
        if not _ENV_RE.match(param):
            return f"{param!r} is not an environment variable name"
    elif param.startswith("action:"):
        if param not in ACTIONS:
            return f"{param!r} is not one of {', '.join(sorted(ACTIONS))}"
    elif param not in CANONICAL_PARAMS:
        return f"{param!r} is not a canonical parameter (DESIGN.md)"
    if not has_value and param not in COMPUTED_PARAMS:
        return f"{param!r} needs a 'to' value: nothing computes one for it"
    return None


def fill_template(text: str, facts: dict[str, object]) -> str:
    """`{group}` and `{group*k}` replaced from the finding's facts; KeyError when one is missing."""

    def one(m: re.Match[str]) -> str:
        v = facts[m.group("name")]
        if not m.group("op"):
            return str(v)
        x = float(str(v).replace(",", ""))
        k = float(m.group("k"))
        y = x * k if m.group("op") == "*" else x / k
        return str(int(y)) if y == int(y) else f"{y:g}"

    return TEMPLATE_RE.sub(one, text)


# The situations an ordered list of candidate changes is kept for (rules/advice/advice.yaml
# `steps`, and an engine profile's own `advice:` table).
ADVICE_SITUATIONS = ("oom.startup", "oom.startup.graphs", "oom.startup.profiling", "oom.runtime")
