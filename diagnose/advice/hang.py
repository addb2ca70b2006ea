"""A phase that does not finish: what it usually waits on (the seed's "stuck at one line"
checklist), and a log that simply stops mid-startup."""

from __future__ import annotations

from ..model.records import Finding
from ..model.taxonomy import TAXONOMY
from .core import Advisor, as_int

# Phases where a log that simply stops is, far more often than not, a stall worth acting on.
STALL_PRONE = {"distributed_init"}


def hang(a: Advisor) -> None:
    if a.ctx.rule is not None:
        return  # an engine's own timeout message: its rule knows the knob
    phase = a.finding.facts.get("phase") or a.finding.phase_at
    ranks = as_int(a.ctx.current("tensor_parallel_size")) or 1
    if phase in ("distributed_init", None) or (ranks > 1 and phase in ("load_weights", "weights_loaded")):
        # with several ranks a stall before the weights are in is most often a rank that never joined
        for param in ("env:NCCL_DEBUG", "env:NCCL_P2P_DISABLE", "shm_size"):
            a.value(param)
    elif phase == "load_weights":
        a.add(
            "model",
            "a local path to the downloaded checkpoint",
            "weight download or verification is stuck: fetch it first (huggingface-cli download) and "
            "check disk throughput",
            a.ctx.current("model"),
        )
        a.add("env:HF_HUB_OFFLINE", "1", "no Hub round-trips once the files are local")
    elif phase in ("weights_loaded", "kv_cache"):
        a.add(
            "enforce_eager",
            "true",
            "skips torch.compile and graph capture, the usual long waits here "
            "(or make sure the compile cache directory is writable)",
            "false",
        )
    elif phase == "cuda_graphs":
        a.value("enforce_eager")
        a.value("action:free_gpu")
    elif phase == "listening":
        a.add(
            "env:NO_PROXY",
            "localhost,127.0.0.1",
            "the warm-up request to itself is not coming back; an HTTP proxy often intercepts localhost",
        )
    elif phase in ("start", "args"):
        # resolving the model: config, tokenizer and file lists come from the Hub
        a.add(
            "env:HF_HUB_OFFLINE",
            "1",
            "resolving the model's files on the Hub (config, tokenizer, file list) is the usual wait "
            "here; download once (huggingface-cli download) and start offline",
        )
        a.add(
            "model",
            "a local path to the downloaded checkpoint",
            "a local directory needs no Hub round-trip at all",
            a.ctx.current("model"),
        )
    elif phase == "devices":
        a.value("action:expose_gpu")


def stall(last_phase: str | None, launch: dict, observed: dict, stopped: bool) -> tuple[Finding, str] | None:  # type: ignore[type-arg]
    """A log that ends mid-startup with no error, as a hang finding to advise on, and how to
    say where it stayed; None when stopping there is no stall worth acting on."""
    # shards or ranks still waiting while others are up: the classic distributed stall
    waiting = (as_int(observed.get("shard_waiting_rank")) or 0) >= 1
    multi = (as_int(launch.get("tensor_parallel_size")) or 1) > 1 or waiting
    stalled = (
        stopped or last_phase in STALL_PRONE or (multi and last_phase in ("load_weights", "weights_loaded"))
    )
    if not stalled or (stopped and not last_phase):
        return None  # stopped before any phase: nothing it waited on to name
    finding = Finding(
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
    if stopped:
        label = f"{TAXONOMY.phase_label.get(last_phase or '', last_phase)} (where it was stopped)"
    elif last_phase == "distributed_init":
        label = "distributed init"
    else:
        label = "startup with ranks still waiting"
    return finding, label


VALUES: dict[str, object] = {}
CLASSES = {"hang": hang}
