"""`diagnose plan` and `diagnose check`: the budget and the pre-flight check behind their options."""

from typing import Annotated, Any

from rich.table import Table
from rich.text import Text

from ..base.errors import (
    EXIT_FOUND,
    EXIT_OK,
    InputError,
)
from ..plan.gpus_given import gpus_from
from .app import RulesOpt, app, at_least, fraction, make_console
from .fast_scan import load_knowledge
from .lean_typer import typer

# plan's options, named once (the command itself reads as what it does)
_PlanConfig = Annotated[str, typer.Option("--config", help="config.json (or the model directory).")]
_PlanWeights = Annotated[
    str | None,
    typer.Option(
        "--weights",
        help="The checkpoint's directory: exact weight bytes from its index or safetensors headers "
        "(default: beside config.json when there).",
    ),
]
_GpusOpt = Annotated[str | None, typer.Option("--gpus", help="nvidia-smi output, or NxGIB such as 2x80.")]
_DtypeOpt = Annotated[str | None, typer.Option("--dtype", help="bf16 or fp16 (default: the config's).")]
_QuantOpt = Annotated[
    str | None, typer.Option("--quantization", help="fp8, int8, awq, gptq, int4 (default: the config's).")
]
_KvDtypeOpt = Annotated[str, typer.Option("--kv-cache-dtype", help="auto or fp8.")]
_TpOpt = Annotated[
    int | None, typer.Option("--tp", help="Tensor-parallel size (default: the smallest that fits).")
]
_PpOpt = Annotated[int, typer.Option("--pp", help="Pipeline-parallel size.")]
_LenOpt = Annotated[int | None, typer.Option("--max-model-len", help="Context length.")]
_SeqsOpt = Annotated[
    int | None,
    typer.Option("--max-num-seqs", help="Concurrent sequences (default: the engine's for the GPU)."),
]
_BatchOpt = Annotated[
    int | None,
    typer.Option("--max-num-batched-tokens", help="Tokens per scheduler step (the profiled batch)."),
]
_VersionOpt = Annotated[
    str | None,
    typer.Option("--engine-version", help="v0, v1 or a vLLM version such as 0.6.6 (the profiled batch)."),
]
_ChunkedOpt = Annotated[
    bool | None,
    typer.Option(
        "--enable-chunked-prefill/--no-enable-chunked-prefill",
        help="V0: whether chunked prefill is on (default: on above 32K context).",
        show_default=False,
    ),
]
_EagerOpt = Annotated[
    bool,
    typer.Option("--enforce-eager", help="No CUDA graphs (vLLM 0.21+ subtracts their memory otherwise)."),
]
_UtilOpt = Annotated[
    float | None, typer.Option("--gpu-memory-utilization", help="Share of each GPU (SGLang: mem fraction).")
]
_EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="Any engine profile: vllm, sglang, lmdeploy, trtllm, tgi, ollama, llamacpp, generic "
        "(each sizes its memory its own way; `rules show ENGINE` says how).",
    ),
]


@app.command()
def plan(
    config: _PlanConfig,
    weights: _PlanWeights = None,
    gpus: _GpusOpt = None,
    dtype: _DtypeOpt = None,
    quantization: _QuantOpt = None,
    kv_cache_dtype: _KvDtypeOpt = "auto",
    tp: _TpOpt = None,
    pp: _PpOpt = 1,
    max_model_len: _LenOpt = None,
    max_num_seqs: _SeqsOpt = None,
    max_num_batched_tokens: _BatchOpt = None,
    engine_version: _VersionOpt = None,
    chunked_prefill: _ChunkedOpt = None,
    eager: _EagerOpt = False,
    util: _UtilOpt = None,
    engine: _EngineOpt = "vllm",
    rules: RulesOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan JSON.")] = False,
) -> None:
    """The memory budget from config.json and the GPUs, and a minimal launch that fits."""
    import json
    from pathlib import Path

    from ..budget.architecture import shape_from_config
    from ..budget.config import checkpoint_quant, load_config, model_id
    from ..budget.search import beyond_auto, with_auto_context
    from ..budget.search import plan as make_plan
    from ..budget.shape import with_checkpoint
    from ..budget.units import engine_units

    units = engine_units(engine, load_knowledge(rules).profiles)
    for name, value in (
        ("--tp", tp),
        ("--pp", pp),
        ("--max-model-len", max_model_len),
        ("--max-num-seqs", max_num_seqs),
        ("--max-num-batched-tokens", max_num_batched_tokens),
    ):
        at_least(name, value, 1)
    fraction("--gpu-memory-utilization", util)
    from ..budget.units import KV_CACHE_DTYPES

    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise typer.BadParameter(
            f"{kv_cache_dtype!r} is not a KV-cache type (one of {', '.join(KV_CACHE_DTYPES)})",
            param_hint="--kv-cache-dtype",
        )
    cfg = load_config(config)
    shape = with_checkpoint(
        shape_from_config(cfg, quantization, dtype),
        weights or str(Path(cfg["__path__"]).parent),
        quantization,
        checkpoint_quant(cfg),
    )
    if weights and shape.exact_bytes is None:
        raise InputError(f"{weights}: no model.safetensors.index.json and no *.safetensors files there")
    pool = gpus_from(gpus, tp)
    sizes = (max_model_len, max_num_seqs, max_num_batched_tokens, kv_cache_dtype, engine)
    p = make_plan(
        shape, pool.count, 0.0, 0.0, tp, pp, util, *sizes, engine_version=engine_version,
        chunked_prefill=chunked_prefill, eager=eager, units=units, pool=pool, model_id=model_id(cfg, config),
        quantization=_launch_quantization(quantization, checkpoint_quant(cfg)),
    )  # fmt: skip
    p, auto = with_auto_context(p, max_model_len)
    beyond = beyond_auto(p, pool) if auto else []
    if json_out:
        doc = {**p.to_json(), "max_model_len_auto": auto is not None}
        doc["beyond_auto"] = [pr.to_json() for pr in beyond]
        doc["gpu_notes"] = pool.notes
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        _print_plan(p, shape, pool, units, auto, beyond)
    raise typer.Exit(EXIT_OK if p.fits else EXIT_FOUND)


def _launch_quantization(asked: str | None, stored: str | None) -> str | None:
    """--quantization for the launch line: what the checkpoint does not carry itself (int4 as the
    AWQ checkpoint it would be)."""
    if not asked or asked.lower() == (stored or ""):
        return None
    return "awq" if asked.lower() == "int4" else asked.lower()


def _print_plan(p: Any, shape: Any, pool: Any, units: Any, auto: int | None, beyond: list[Any]) -> None:
    c = make_console()
    head = "✓ fits" if p.fits else "✗ does not fit"
    if auto:
        head += f" with {units.flags.get('max_model_len', '--max-model-len')} {auto}"
    c.print(Text(f"{head}: {shape.name} on {pool.summary}", style="bold green" if p.fits else "bold red"))
    for n in pool.notes:
        c.print(Text(f"  ! {n}", style="yellow"))
    t = Table(box=None, show_edge=False)
    t.add_column("per GPU")
    t.add_column("", justify="right")
    for k, v in _plan_rows(p, shape, units):
        t.add_row(k, v)
    c.print(t)
    for r in p.reasons:
        c.print(Text(f"  ✗ {r}", style="red"))
    for w in p.what_would:
        c.print(Text(f"  → {w}" if w.startswith("running as is") else f"  → would fit: {w}", style="green"))
    for pr in beyond:
        c.print(Text(f"  + beyond auto: {pr.text}", style="green"))
    for a in p.assumptions + shape.partial:
        c.print(Text(f"  · {a}", style="dim"))
    c.print()
    launch = p.to_json()["launch"]
    if launch:
        c.print(Text("  " + launch.replace("\n", "\n  "), style="bold"))
    elif not p.what_would:
        c.print(
            Text(
                "  nothing on these GPUs fits this model: more or larger GPUs, or a smaller model",
                style="bold",
            )
        )


def _plan_rows(p: Any, shape: Any, units: Any) -> list[tuple[str, str]]:
    rows = [
        ("parameters (whole model)", f"{shape.params_total / 1e9:.2f} B"),
        ("weights", f"{p.weights_gib_per_gpu:.2f} GiB"),
        ("activation peak (estimate)", f"{p.activation_gib:.2f} GiB"),
        ("non-torch overhead", f"{p.overhead_gib:.2f} GiB"),
        ("KV-cache budget", f"{p.kv_gib_per_gpu:.2f} GiB"),
        ("KV per token", f"{p.to_json()['kv_bytes_per_token_per_gpu'] / 1024:.1f} KiB"),
        ("KV tokens (per replica)", f"{p.kv_tokens:,}"),
    ]
    if units.kv_budget == "layers":
        return [
            *rows[:2],
            ("compute graph (estimate)", f"{p.activation_gib:.2f} GiB"),
            ("kept free", f"{p.overhead_gib:.2f} GiB"),
            ("KV cache on the GPU", f"{p.kv_gib_per_gpu:.2f} GiB"),
            ("context (tokens)", f"{p.kv_tokens:,}"),
            ("layers on the GPU", f"{p.gpu_layers} of {shape.layers + 1}"),
        ]
    return [
        *rows,
        (f"concurrency at {p.max_model_len:,} tokens", f"{p.max_concurrency:.2f}×"),
        (f"longest context for {p.max_num_seqs} sequences", f"{p.longest_context_for_seqs:,}"),
        ("tensor × pipeline parallel", f"{p.tp} × {p.pp}"),
    ]


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def check(
    ctx: typer.Context,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="nvidia-smi output, or NxGIB such as 2x80.")
    ] = None,
    config: Annotated[
        str | None, typer.Option("--config", help="config.json (default: MODEL/config.json).")
    ] = None,
    engine_version: Annotated[
        str | None,
        typer.Option(
            "--engine-version",
            help="The engine's version (default: the one installed here, if any): v0, v1 or e.g. 0.10.2.",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the check JSON.")] = False,
) -> None:
    """Pre-flight a launch command (`diagnose check -- vllm serve MODEL …`) before it runs."""
    import json

    from ..outputs.json_report import finite
    from ..plan.check import preflight

    cmd = [a for a in ctx.args if a != "--"]
    if not cmd:
        raise typer.BadParameter(
            "give the launch command after --, e.g. diagnose check -- vllm serve MODEL -tp 8"
        )
    from ..plan.launch_command import leading_env

    pool = gpus_from(gpus, visible=leading_env(cmd).get("CUDA_VISIBLE_DEVICES")) if gpus else None
    summary = pool.summary if pool else "no GPU information"
    res = preflight(cmd, config, pool, load_knowledge(None).profiles, engine_version=engine_version)
    if json_out:
        print(json.dumps(finite(res), indent=2, ensure_ascii=False))
    else:
        c = make_console()
        if res["ok"] and not res["memory_checked"]:
            # nothing said it cannot work, but nothing held the model against the GPUs either
            head, style = "· memory not checked", "bold"
        else:
            head, style = ("✓ can work", "bold green") if res["ok"] else ("✗ cannot work", "bold red")
        c.print(Text(f"{head}: {res['summary']}  [{summary}]", style=style))
        from ..model.records import Change
        from ..outputs.text import change_text

        for pr in res["problems"]:
            c.print(Text(f"  ✗ {pr['text']}", style="red"))
            if pr.get("how"):
                c.print(Text(f"    → {pr['how']}", style="green"))
            elif pr["change"]:
                c.print(Text("    → " + change_text(Change.from_json(pr["change"])), style="green"))
            for alt in pr.get("alternatives", []):
                c.print(Text(f"    or: {alt}", style="dim green"))
        for n in pool.notes if pool else []:
            c.print(Text(f"  ! {n}", style="yellow"))
        for n in res["notes"]:
            c.print(Text(f"  · {n}", style="dim"))
        if res["fixed_launch"]:
            c.print(Text(f"  → launch: {res['fixed_launch']}", style="bold green"))
    raise typer.Exit(EXIT_OK if res["ok"] else EXIT_FOUND)
