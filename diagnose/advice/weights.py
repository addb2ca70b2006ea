"""Weights: their precision and quantisation (the checkpoint itself, the engine version and
remote code are constant texts in rules/advice/advice.yaml)."""

from __future__ import annotations

from .core import Advisor


def dtype(a: Advisor) -> None:
    cur = str(a.ctx.current("dtype") or "auto")
    if "bfloat16" in cur or "bf16" in cur or cur == "auto":
        a.add("dtype", "half", "float16 runs on every CUDA GPU; bfloat16 needs compute capability 8.0", cur)


def quantization(a: Advisor) -> None:
    ckpt = a.finding.facts.get("checkpoint_quantization")
    if ckpt:
        a.add(
            "quantization",
            str(ckpt),
            f"the checkpoint was quantized with {ckpt}; the flag must name the same method (or be left out)",
            a.ctx.current("quantization"),
        )
        return
    a.add(
        "quantization",
        "fp8",
        "fp8 weights need half the memory of bf16 (Ada/Hopper GPUs or newer)",
        a.ctx.current("quantization"),
    )


VALUES = {"dtype": dtype, "quantization": quantization}
CLASSES: dict[str, object] = {}
